//! Small randomness helpers (UIDs, jitter) without a `rand` dependency.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// 64 random bits: `RandomState` is seeded from the OS once per process and perturbed per call.
pub fn u64() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// A uniformly distributed float in [0, 1).
pub fn unit() -> f64 {
    (u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// `wait.Jitter(d, factor)`: `d + rand[0,1) * factor * d`.
pub fn jitter(d: Duration, factor: f64) -> Duration {
    if factor <= 0.0 {
        return d;
    }
    d + d.mul_f64(unit() * factor)
}

/// A random RFC 4122 version-4 UUID, like the API server assigns to pods.
pub fn uuid_v4() -> String {
    let a = u64();
    let b = u64();
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&a.to_be_bytes());
    bytes[8..].copy_from_slice(&b.to_be_bytes());
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Eight random hex digits (kubelet's termination-log file names).
pub fn hex8() -> String {
    format!("{:08x}", u64() as u32)
}
