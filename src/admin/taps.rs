//! How many taps the admin socket serves at once (issue #44): at most `admin.max_taps_per_uid`
//! to one non-root peer uid (SO_PEERCRED) and `admin.max_taps` in all. Each tap may queue up to
//! `tap::hub::MAX_QUEUED_BYTES` and is offered every reported call: without a cap, anyone the
//! socket's mode lets in could open thousands of `--full` taps, never read them, and grow crisp
//! and its relay threads' work without bound. Root is bound only by the total. A tap over
//! either cap is refused RESOURCE_EXHAUSTED, naming the cap. Sans-I/O: [`TapSlots::take`]
//! counts, the returned [`TapSlot`] gives its place back when dropped (the tap's end).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

/// Why a tap was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TapRefusal {
    #[error("uid {uid} already has {cap} taps open (admin.max_taps_per_uid); close one first")]
    PerUid { uid: u32, cap: usize },
    #[error("{cap} taps are open on this node (admin.max_taps); close one first")]
    Total { cap: usize },
}

/// The open taps, by peer uid (`None`: credentials unknown, counted as one more uid).
pub(crate) struct TapSlots {
    per_uid: usize,
    total: usize,
    open: Mutex<(usize, HashMap<Option<u32>, usize>)>,
}

/// One open tap's place; given back when dropped.
pub(crate) struct TapSlot {
    slots: Arc<TapSlots>,
    uid: Option<u32>,
}

impl TapSlots {
    pub(crate) fn new(per_uid: usize, total: usize) -> Arc<TapSlots> {
        Arc::new(TapSlots {
            per_uid,
            total,
            open: Mutex::new((0, HashMap::new())),
        })
    }

    /// A place for one more tap of `uid`, or why not.
    pub(crate) fn take(self: &Arc<Self>, uid: Option<u32>) -> Result<TapSlot, TapRefusal> {
        let mut open = self.open.lock();
        if open.0 >= self.total {
            return Err(TapRefusal::Total { cap: self.total });
        }
        let mine = open.1.get(&uid).copied().unwrap_or(0);
        if uid != Some(0) && mine >= self.per_uid {
            return Err(TapRefusal::PerUid {
                uid: uid.unwrap_or(u32::MAX),
                cap: self.per_uid,
            });
        }
        open.0 += 1;
        open.1.insert(uid, mine + 1);
        Ok(TapSlot {
            slots: self.clone(),
            uid,
        })
    }

    /// Taps open now.
    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
        self.open.lock().0
    }
}

impl Drop for TapSlot {
    fn drop(&mut self) {
        let mut open = self.slots.open.lock();
        open.0 = open.0.saturating_sub(1);
        if let Some(n) = open.1.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                open.1.remove(&self.uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uid_gets_its_cap_and_the_node_its_total() {
        let slots = TapSlots::new(2, 5);
        let a1 = slots.take(Some(1000)).unwrap();
        let _a2 = slots.take(Some(1000)).unwrap();
        assert_eq!(
            slots.take(Some(1000)).err(),
            Some(TapRefusal::PerUid { uid: 1000, cap: 2 })
        );
        // Another uid has its own cap; root only the total.
        let _b = slots.take(Some(1001)).unwrap();
        let _r1 = slots.take(Some(0)).unwrap();
        let _r2 = slots.take(Some(0)).unwrap();
        assert_eq!(slots.open(), 5);
        assert_eq!(
            slots.take(Some(0)).err(),
            Some(TapRefusal::Total { cap: 5 })
        );
        // A tap's end gives its place back.
        drop(a1);
        assert_eq!(slots.open(), 4);
        let _a3 = slots.take(Some(1000)).unwrap();
        // Unknown credentials are one more "uid", capped like any.
        let slots = TapSlots::new(1, 5);
        let _u = slots.take(None).unwrap();
        assert!(matches!(slots.take(None), Err(TapRefusal::PerUid { .. })));
    }
}
