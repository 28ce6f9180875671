//! kubelet's `kuberuntime_image.go` and `images.EnsureImageExists`: the image a container needs,
//! pulled by its pull policy (KUBELET-CRI §1.1a).

use super::*;

impl Runtime {
    /// `EnsureImageExists`: ImageStatus, then PullImage only if the policy needs it (§1.1a).
    pub(super) async fn ensure_image_exists(
        &self,
        pod: &PodSpec,
        c: &ContainerSpec,
        sandbox_config: &cri::PodSandboxConfig,
        meta: &CallMeta,
    ) -> Result<String, (&'static str, String)> {
        let image = apply_default_image_tag(&c.image);
        let spec = cri::ImageSpec {
            image,
            annotations: pod
                .annotations
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            ..Default::default()
        };
        let resp = self
            .cri
            .image_status(spec.clone(), meta.clone())
            .await
            .map_err(|s| {
                (
                    ERR_IMAGE_INSPECT,
                    format!("Failed to inspect image {:?}: {}", c.image, go_error(&s)),
                )
            })?;
        // GetImageRef: the first repo digest, else the ID; empty = absent.
        let image_ref = resp
            .image
            .map(|i| i.repo_digests.first().cloned().unwrap_or(i.id))
            .unwrap_or_default();
        let present = !image_ref.is_empty();
        let should_pull = match c.image_pull_policy {
            PullPolicy::Never => false,
            PullPolicy::Always => true,
            PullPolicy::IfNotPresent => !present,
        };
        if !should_pull {
            if present {
                return Ok(image_ref);
            }
            return Err((
                ERR_IMAGE_NEVER_PULL,
                format!(
                    "Container image {:?} is not present with pull policy of Never",
                    c.image
                ),
            ));
        }
        let key = format!("{}_{}", pod.uid, c.image);
        if lock(&self.image_backoff).is_in_backoff_since_update(&key, SystemTime::now()) {
            return Err((
                ERR_IMAGE_PULL_BACK_OFF,
                format!("Back-off pulling image {:?}", c.image),
            ));
        }
        let pulled = {
            let _serial = self.pull_lock.lock().await;
            self.cri
                .pull_image(spec, Some(sandbox_config.clone()), meta.clone())
                .await
        };
        match pulled {
            Ok(r) => Ok(r),
            Err(s) => {
                lock(&self.image_backoff).next(&key, SystemTime::now());
                Err((ERR_IMAGE_PULL, go_error(&s)))
            }
        }
    }
}

/// `applyDefaultImageTag`: no tag and no digest → `:latest`.
pub(super) fn apply_default_image_tag(image: &str) -> String {
    let last = image.rsplit('/').next().unwrap_or(image);
    if image.contains('@') || last.contains(':') {
        image.to_string()
    } else {
        format!("{image}:latest")
    }
}
