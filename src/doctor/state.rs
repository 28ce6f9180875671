//! Check 6: the state directory (`state_dir`) can be written durably — Job mode's marks and
//! the held calls' intents live there (issue #43). Checked by one durable write of a probe file
//! (the same writer crisp uses), removed again.

use std::path::Path;

use super::*;
use crate::ordering::durable::write_durably;

/// The probe file's name: not a container id nor an intent, never loaded by crisp.
const PROBE: &str = ".doctor-probe";

pub(super) fn check_state_dir(opts: &Options, cfg: &Config, r: &mut Report) {
    let dir = under_root(&opts.root, &cfg.state_dir);
    let shown = cfg.state_dir.display();
    let fix = format!(
        "make {shown} a writable directory on a local disk with free space (or set `state_dir` in the config to one), then restart crisp"
    );
    if !dir.is_dir() {
        let parent_ok = dir.parent().is_some_and(Path::is_dir);
        if dir.exists() || !parent_ok {
            return fail_or_warn(
                cfg,
                r,
                format!("{shown} is not a directory crisp can create"),
                fix,
            );
        }
        r.ok(
            "state dir",
            format!("{shown} does not exist yet: crisp creates it at start"),
        );
        return;
    }
    let written = write_durably(&dir, PROBE, b"");
    let _ = std::fs::remove_file(dir.join(PROBE));
    match written {
        Ok(()) => r.ok("state dir", format!("{shown} is writable (durably)")),
        Err(e) => fail_or_warn(cfg, r, format!("{shown} cannot be written: {e}"), fix),
    }
}

/// With job mode on, a state directory crisp cannot write stops no Job's sidecars: FAIL.
/// Without, held calls do not survive a restart: WARN.
fn fail_or_warn(cfg: &Config, r: &mut Report, detail: String, fix: String) {
    if cfg.job.enabled {
        r.fail(
            "state dir",
            format!("{detail}; Job pods' sidecars will not be stopped and held calls will not survive a crisp restart"),
            fix,
        );
    } else {
        r.warn(
            "state dir",
            format!("{detail}; held calls will not survive a crisp restart"),
            fix,
        );
    }
}
