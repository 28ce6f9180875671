//! The memory tests' global allocator (`tests/exec_probe_memory.rs`, `tests/tap_memory.rs`):
//! every call goes to the system allocator unchanged, and the bytes the process holds, their
//! peak and the number of allocations are counted. Each of those tests is a binary of its own,
//! so the counts are of that one process — what it holds, not what a helper reports about
//! itself.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Install with `#[global_allocator] static ALLOC: Counting = Counting;`.
pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    ALLOCS.fetch_add(1, Ordering::Relaxed);
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is passed to the system allocator unchanged; only sizes are counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            grew(l.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            grew(l.size());
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            LIVE.fetch_sub(l.size(), Ordering::Relaxed);
            grew(new);
        }
        q
    }
}

/// A starting point: the peak is reset to what is held now.
pub struct Mark {
    base: usize,
    allocs: usize,
}

pub fn mark() -> Mark {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    Mark {
        base,
        allocs: ALLOCS.load(Ordering::Relaxed),
    }
}

impl Mark {
    /// How far the heap rose above the mark at its highest since.
    pub fn peak_growth(&self) -> usize {
        PEAK.load(Ordering::Relaxed).saturating_sub(self.base)
    }

    /// Allocations (and reallocations) since the mark.
    #[allow(dead_code)] // one of the two binaries counts only bytes
    pub fn allocs(&self) -> usize {
        ALLOCS.load(Ordering::Relaxed) - self.allocs
    }
}
