//! Check 1: the config file parses and validates, by the same code as `crisp` itself.

use std::path::Path;

use super::*;
use crate::config::{Config, DEFAULT_CONFIG_PATH};

pub(super) fn check_config(opts: &Options, r: &mut Report) -> Config {
    let (path, explicit) = match &opts.config {
        Some(p) => (p.clone(), true),
        None => (
            under_root(&opts.root, Path::new(DEFAULT_CONFIG_PATH)),
            false,
        ),
    };
    if !explicit && !path.exists() {
        r.ok(
            "config",
            format!(
                "no config file at {}: built-in defaults apply",
                path.display()
            ),
        );
        return Config::default();
    }
    match Config::load(Some(&path)) {
        Ok(mut cfg) => {
            let (l, u) = (
                opts.listen.clone().unwrap_or(cfg.listen.clone()),
                opts.upstream.clone().unwrap_or(cfg.upstream.clone()),
            );
            cfg.listen = l;
            cfg.upstream = u;
            match cfg.validate("command line") {
                Ok(()) => r.ok(
                    "config",
                    format!(
                        "{} is valid (listen {}, upstream {})",
                        path.display(),
                        cfg.listen.display(),
                        cfg.upstream.display()
                    ),
                ),
                Err(e) => r.fail(
                    "config",
                    e.to_string(),
                    "pass different --listen/--upstream".to_string(),
                ),
            }
            cfg
        }
        Err(e) => {
            r.fail("config", e.to_string(), format!("edit {} (keys: docs/INSTALL.md), then check it with `crisp --check-config --config {}`", path.display(), path.display()));
            Config::default()
        }
    }
}
