//! `crisp doctor`: flags to [`crisp::doctor::Options`], the report on standard output.

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// Config file to check. Default: ROOT/etc/crisp/config.toml if it exists.
    #[arg(long, short = 'c', value_name = "FILE")]
    config: Option<PathBuf>,
    /// crisp's socket, a node path [default: `listen` from the config].
    #[arg(long, value_name = "PATH")]
    listen: Option<PathBuf>,
    /// The runtime's socket, a node path [default: `upstream` from the config].
    #[arg(long, value_name = "PATH")]
    upstream: Option<PathBuf>,
    /// The node's filesystem root: node paths (sockets, kubelet files, units) are looked up
    /// under it.
    #[arg(long, value_name = "DIR", default_value = "/")]
    root: PathBuf,
}

/// Runs `crisp doctor`: exits 1 when a check FAILs.
pub fn run(args: DoctorArgs) -> ExitCode {
    let opts = crisp::doctor::Options {
        root: args.root,
        config: args.config,
        listen: args.listen,
        upstream: args.upstream,
        ..Default::default()
    };
    let Some(rt) = super::serve::runtime() else {
        return ExitCode::FAILURE;
    };
    let report = rt.block_on(crisp::doctor::run(&opts));
    println!("{report}");
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
