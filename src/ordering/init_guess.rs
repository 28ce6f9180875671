//! Init or regular? (DESIGN.md §3.3): a container no annotation names, refused while no
//! sidecar exists, is judged by what kubelet does next — the ImageStatus and PullImage calls it
//! makes for the pod are watched only while such a judgement is open.

use std::collections::{HashMap, HashSet};

use super::Engine;
use crate::cri::views;

/// Telling init containers from regular ones when no annotation names them: the CRI does not
/// say (KUBELET-CRI §2.4), kubelet's behaviour after a refusal does. A container refused while
/// no sidecar exists is either
/// - an init container: `SyncPod` returns at once, and kubelet's next call for this pod is the
///   same container again, ≥ 1 s later (§1.1, §1.3); or
/// - a regular container: kubelet goes on to the next container in the same loop (§1.2), whose
///   first call is an ImageStatus carrying the pod's annotations, maybe a PullImage carrying
///   the pod's sandbox config, maybe a CreateContainer — even when that container's creation
///   then fails (image pull error, back-off, CreateContainerConfigError).
///
/// So between a refusal and kubelet's return to the same container: another CreateContainer,
/// or the calls of two container attempts (two annotated ImageStatus, or two PullImage — one
/// attempt makes one of each at most), prove it regular. Anything less: init.
///
/// That ImageStatus names the pod is kubelet's own doing, checked in its source for 1.20–1.29:
/// `EnsureImageExists` (pkg/kubelet/images) builds the image spec with every pod annotation and
/// `GetImageRef` sends it as `ImageStatusRequest.image.annotations`; PullImage carries the
/// sandbox config. The e2e kubelet emulator does the same.
#[derive(Default)]
pub(super) struct InitGuess {
    /// Refused, not judged yet: what kubelet did for this pod since.
    open: HashMap<String, Since>,
    /// Proven regular.
    regular: HashSet<String>,
    /// Let through as init containers.
    init: HashSet<String>,
}

#[derive(Default, Debug, Clone, Copy)]
struct Since {
    image_status: u32,
    pulls: u32,
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum Judgement {
    /// First refusal: the answer comes with kubelet's next call.
    Unknown,
    Regular,
    Init,
}

impl InitGuess {
    pub(super) fn judge(&mut self, name: &str) -> Judgement {
        if self.regular.contains(name) {
            return Judgement::Regular;
        }
        if self.init.contains(name) {
            return Judgement::Init;
        }
        match self.open.remove(name) {
            Some(since) if since.image_status >= 2 || since.pulls >= 2 => {
                self.regular.insert(name.to_string());
                Judgement::Regular
            }
            Some(_) => {
                self.init.insert(name.to_string());
                Judgement::Init
            }
            None => {
                self.open.insert(name.to_string(), Since::default());
                Judgement::Unknown
            }
        }
    }

    /// kubelet creates `name`: every other refused container is regular.
    pub(super) fn note_create(&mut self, name: &str) {
        let others: Vec<String> = self
            .open
            .keys()
            .filter(|other| *other != name)
            .cloned()
            .collect();
        for other in others {
            self.open.remove(&other);
            self.regular.insert(other);
        }
    }

    fn note_image_call(&mut self, pull: bool) {
        for since in self.open.values_mut() {
            if pull {
                since.pulls += 1;
            } else {
                since.image_status += 1;
            }
        }
    }

    /// Some refused container still waits for its judgement.
    pub(super) fn judging(&self) -> bool {
        !self.open.is_empty()
    }

    /// Records a container found to be an init container after the fact (job mode).
    pub(super) fn note_init(&mut self, name: &str) {
        self.init.insert(name.to_string());
    }

    /// Let through as an init container.
    pub(super) fn is_init(&self, name: &str) -> bool {
        self.init.contains(name)
    }
}

impl Engine {
    /// ImageStatus: kubelet's first call for a container names the pod by its annotations.
    pub(super) fn on_image_status(&self, msg: &[u8]) {
        if let Ok(request) = views::decode::<views::ImageStatusRequest>(msg) {
            let annotations = request.image.map(|image| image.annotations);
            self.note_image_call(annotations.unwrap_or_default(), false);
        }
    }

    /// PullImage: it carries the pod's sandbox config.
    pub(super) fn on_pull_image(&self, msg: &[u8]) {
        if let Ok(request) = views::decode::<views::PullImageRequest>(msg) {
            let annotations = request.sandbox_config.map(|config| config.annotations);
            self.note_image_call(annotations.unwrap_or_default(), true);
        }
    }

    /// An ImageStatus or PullImage of a pod that has a refused container awaiting judgement.
    fn note_image_call(&self, annotations: HashMap<String, String>, pull: bool) {
        if annotations.is_empty() {
            return; // getImageUser's ImageStatus: no pod named.
        }
        let Some(sandbox) = self
            .guessing
            .get(&annotations_fingerprint(&annotations))
            .map(|sandbox| sandbox.clone())
        else {
            return;
        };
        let Some(pod) = self.pods.get(&sandbox).map(|pod| pod.clone()) else {
            return;
        };
        let mut guess = pod.guess();
        guess.note_image_call(pull);
        if !guess.judging() {
            self.guessing.remove(&pod.annotations_fp);
        }
    }
}

/// A pod's identity as ImageStatus and PullImage show it: its full annotation set (which
/// kubelet stamps per pod with `kubernetes.io/config.seen`).
pub(super) fn annotations_fingerprint(annotations: &HashMap<String, String>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut pairs: Vec<(&String, &String)> = annotations.iter().collect();
    pairs.sort();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    pairs.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A guess that has judged `name` once (Unknown: refused), then saw these annotated image
    /// calls (`true`: a PullImage, `false`: an ImageStatus).
    fn guess_after_image_calls(name: &str, calls: &[bool]) -> InitGuess {
        let mut guess = InitGuess::default();
        assert_eq!(guess.judge(name), Judgement::Unknown);
        for &pull in calls {
            guess.note_image_call(pull);
        }
        guess
    }

    #[test]
    fn init_guess_init_container_comes_straight_back() {
        // Its own retry: one annotated ImageStatus (and a pull under imagePullPolicy Always).
        let mut guess = guess_after_image_calls("init", &[false, true]);
        assert_eq!(guess.judge("init"), Judgement::Init);
        assert_eq!(guess.judge("init"), Judgement::Init, "sticky");
    }

    #[test]
    fn init_guess_regular_when_kubelet_moved_on_though_the_sidecar_failed() {
        // The sidecar after it: ImageStatus, failed PullImage (ErrImagePull); then the retry's
        // own ImageStatus. Two attempts: a regular container.
        let mut guess = guess_after_image_calls("app", &[false, true, false]);
        assert_eq!(guess.judge("app"), Judgement::Regular);
        // Later syncs (ImagePullBackOff: no call at all) keep the verdict.
        assert_eq!(guess.judge("app"), Judgement::Regular);
    }

    #[test]
    fn init_guess_regular_when_another_container_was_created() {
        let mut guess = InitGuess::default();
        assert_eq!(guess.judge("app"), Judgement::Unknown);
        guess.note_create("proxy");
        guess.note_create("app");
        assert_eq!(guess.judge("app"), Judgement::Regular);
    }
}
