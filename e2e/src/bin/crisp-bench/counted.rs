//! What crisp does per relayed call over its splice, counted rather than timed: callgrind's
//! instructions and the distinct lines of code a call runs (`hack/relay-instructions.sh`,
//! BENCHMARKS.md, "The code a call runs"). The timed tables say how much crisp adds over its
//! floor on this machine; these say what it is, the same on any machine with the same build.

use anyhow::Result;
use std::path::Path;

/// One relayed unary call (grpc-go's sequential `Version`), counted in one binary.
pub struct PerCall {
    /// Instructions of the whole process: (after 600 calls − after 100) / 500.
    pub instructions: f64,
    /// The distinct 64-byte lines of code that ran at least once every two calls of 600.
    pub lines: f64,
}

/// `hack/relay-instructions.sh BIN n`: the program's instructions and code lines.
fn run(bin: &Path, n: usize, splice: bool) -> Result<(f64, f64)> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut cmd = std::process::Command::new("bash");
    cmd.arg(repo.join("hack/relay-instructions.sh"))
        .arg(bin)
        .arg(n.to_string())
        .env("CRISP_GRPCGO_BIN", crisp_e2e::grpcgo::grpcgo_binary()?);
    if splice {
        cmd.env("CRISP_RELAY_SPLICE", "1");
    }
    let out = cmd.output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |key: &str| {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|t| t.parse::<f64>().ok())
    };
    match (field("total="), field("lines=")) {
        (Some(total), Some(lines)) if out.status.success() => Ok((total, lines)),
        _ => anyhow::bail!(
            "hack/relay-instructions.sh (valgrind; `apt-get install valgrind`) gave no count: {} {}",
            text.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    }
}

/// crisp `bin` counted over 600 and 100 calls; with `splice`, its splice
/// (`CRISP_RELAY_SPLICE=1`).
pub fn per_call(bin: &Path, splice: bool) -> Result<PerCall> {
    let (long, long_lines) = run(bin, 600, splice)?;
    let (short, _) = run(bin, 100, splice)?;
    Ok(PerCall {
        instructions: (long - short) / 500.0,
        lines: long_lines,
    })
}

/// Whether callgrind is here to count with.
pub fn available() -> bool {
    std::process::Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The report's section: each crisp lane's count beside its splice's, or why there is none.
pub fn report(crisp: &Path, before: Option<&Path>) -> Result<String> {
    use std::fmt::Write;
    let mut out = String::from(
        "\n### What crisp does per call over its floor (callgrind, `hack/relay-instructions.sh`)\n\n",
    );
    if !available() {
        out += "Not counted: valgrind is not installed (`apt-get install valgrind`).\n";
        return Ok(out);
    }
    out += "One relayed unary `Version` from grpc-go, whole process, counted not timed. A timed \
            ratio above 1.0 to crisp-splice's added latency is this work run cold: the code \
            lines are what a call fetches again after another process had the caches \
            (BENCHMARKS.md, \"The code a call runs\").\n\n\
            | lane | instructions a call | 64-byte code lines a call |\n|---|---|---|\n";
    let mut lanes = vec![("crisp", crisp, false), ("crisp-splice", crisp, true)];
    if let Some(b) = before {
        lanes.push(("crisp-before", b, false));
    }
    for (name, bin, splice) in lanes {
        // A count that fails is said in the report: the timed tables above still stand.
        match per_call(bin, splice) {
            Ok(c) => writeln!(out, "| {name} | {:.0} | {:.0} |", c.instructions, c.lines)?,
            Err(e) => writeln!(out, "| {name} | not counted: {e:#} | |")?,
        }
    }
    Ok(out)
}
