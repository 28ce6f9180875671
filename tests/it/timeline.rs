//! `crisp timeline` (issue #21 item 3): the real binary reads a tap recording written in the
//! tap's own JSON format (`crisp::cli::view::json_line`), and its SVG is rendered by a real
//! renderer, librsvg's `rsvg-convert` (Debian librsvg2-bin, installed by hack/setup.sh): the
//! picture must have the size the SVG declares and the held call's bar in the held colour.

// The same renderer and PNG reader as the e2e picture tests (crisp's tests cannot depend on the
// crisp-e2e crate, which depends on crisp): one file, compiled into both.
#[path = "../../e2e/src/picture.rs"]
mod picture;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use picture::{render_svg, Picture};

use crisp::admin_api::{tap_event::Event, CallEvent};
use crisp::cli::timeline::{colour, TEXT_WIDTH};
use crisp::cli::view::json_line;

const T0: i64 = 1_764_000_000_000_000_000;

/// One call event as `crisp tap -o` records it.
/// `who`: namespace, pod, container; `when`: start, duration, held (ms); `status`: code, its name, message.
fn event(
    method: &str,
    who: (&str, &str, &str),
    when: (i64, u64, u64),
    status: (i32, &str, &str),
) -> String {
    let ((ns, pod, container), (start_ms, dur_ms, held_ms), (code, code_name, message)) =
        (who, when, status);
    let kind = if method.ends_with("Status") {
        "polling"
    } else {
        "mutating"
    };
    let ev = CallEvent {
        call_id: start_ms as u64,
        start_unix_nanos: T0 + start_ms * 1_000_000,
        method: method.into(),
        path: format!("/runtime.v1.RuntimeService/{method}"),
        cri_version: "v1".into(),
        kind: kind.into(),
        pod_namespace: ns.into(),
        pod_name: pod.into(),
        container_name: container.into(),
        duration_micros: dur_ms * 1000,
        held_micros: held_ms * 1000,
        code: Some(code),
        code_name: code_name.into(),
        message: message.into(),
        redacted: true,
        ..Default::default()
    };
    json_line(&Event::Call(ev)).to_string()
}

/// The README demo's shape: the app refused until the proxy exists, its CreateContainer held
/// `app_held_ms` until the proxy is ready, the proxy's StopContainer held until the app exited.
fn demo_recording(ns: &str, pod: &str, app_held_ms: u64, proxy_stop_held_ms: u64) -> String {
    let refusal = "crisp: sidecar proxy of pod demo/web is not created yet; kubelet will retry";
    let e =
        |m: &str, c: &str, s: i64, d: u64, h: u64| event(m, (ns, pod, c), (s, d, h), (0, "OK", ""));
    [
        e("RunPodSandbox", "", 0, 250, 0),
        event(
            "CreateContainer",
            (ns, pod, "app"),
            (260, 2, 0),
            (9, "FailedPrecondition", refusal),
        ),
        e("CreateContainer", "proxy", 270, 30, 0),
        e("StartContainer", "proxy", 305, 60, 0),
        e("CreateContainer", "app", 400, 30 + app_held_ms, app_held_ms),
        e("StartContainer", "app", 440 + app_held_ms as i64, 60, 0),
        e("StopContainer", "app", 5000, 1100, 0),
        e(
            "StopContainer",
            "proxy",
            5000,
            1120 + proxy_stop_held_ms,
            proxy_stop_held_ms,
        ),
        e(
            "StopPodSandbox",
            "",
            6200 + proxy_stop_held_ms as i64,
            80,
            0,
        ),
        e(
            "RemovePodSandbox",
            "",
            6300 + proxy_stop_held_ms as i64,
            40,
            0,
        ),
    ]
    .join("\n")
        + "\n{\"dropped\":2,\"dropped_total\":2}\n"
}

fn crisp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_crisp"))
        .args(args)
        .output()
        .expect("run crisp")
}

/// Runs `crisp timeline [extra] --pod demo/web --svg SVG INPUT`, which must succeed; its
/// standard output.
fn draw(extra: &[&str], svg: &Path, input: &Path) -> String {
    let mut args = extra.to_vec();
    args.extend(["--pod", "demo/web"]);
    let stdout = draw_as(&args, svg, input);
    eprintln!("{stdout}");
    stdout
}

/// Runs `crisp timeline [args] --svg SVG INPUT`, which must succeed; its standard output.
fn draw_as(args: &[&str], svg: &Path, input: &Path) -> String {
    let mut all = vec!["timeline"];
    all.extend_from_slice(args);
    all.extend([
        "--svg",
        svg.to_str().expect("utf-8"),
        input.to_str().expect("utf-8"),
    ]);
    let out = crisp(&all);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "crisp {all:?} failed: {}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}

/// The `height` the SVG declares.
fn declared_height(svg: &str) -> u32 {
    let h = svg
        .split("height=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("height attribute");
    h.parse::<f64>().expect("numeric height").ceil() as u32
}

/// Pixels of the legend's swatch (14 × 10), the only place a colour appears with no such call.
const SWATCH: usize = 140;

#[test]
fn svg_renders_with_holds_and_refusals_in_their_colours() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = write(
        dir.path(),
        "calls.jsonl",
        &demo_recording("demo", "web", 3000, 1000),
    );
    let svg_path = dir.path().join("web.svg");
    let stdout = draw(&[], &svg_path, &input);
    // The terminal view: one row per call, none wider than 100 columns.
    assert!(
        stdout.lines().all(|l| l.chars().count() <= TEXT_WIDTH),
        "{stdout}"
    );
    assert_eq!(
        stdout.lines().filter(|l| l.contains('|')).count(),
        10,
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("CreateContainer   app")
                && l.contains('░')
                && l.contains("held 3.00s")),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.contains('×') && l.contains("FailedPrecondition")),
        "{stdout}"
    );

    let svg = std::fs::read_to_string(&svg_path).expect("svg written");
    assert!(
        !svg.contains("<script") && !svg.contains("href"),
        "the SVG is self-contained"
    );
    let png = render_svg(&svg_path).expect("rsvg-convert renders the timeline");
    if let Some(keep) = std::env::var_os("CRISP_TIMELINE_KEEP") {
        let _ = std::fs::copy(&png, keep);
    }
    let pic = Picture::load(&png).expect("png");
    let h = pic.height;
    assert_eq!((pic.width, h), (1100, declared_height(&svg)));
    assert!(h > 78 + 10 * 20, "a row per call: {h} px");
    // Bars are 12 px high. The app's 3 s hold spans ~3/7.4 of the 600 px time axis, the proxy's
    // stop hold ~1/7.4.
    let held = pic.count(colour::HELD) - SWATCH;
    let forwarded = pic.count(colour::FORWARDED) - SWATCH;
    let failed = pic.count(colour::FAILED);
    eprintln!("pixels: held {held}, forwarded {forwarded}, failed {failed}");
    assert!(
        held > 4 * 12 * 80,
        "the held parts' bars: {held} px of the held colour"
    );
    assert!(forwarded > 12 * 100, "forwarded bars: {forwarded} px");
    // The refusal's 2 px bar, its row note, and its line under the chart, in the failure colour.
    assert!(
        failed > SWATCH + 2 * 12,
        "the refusal: {failed} px of the failure colour"
    );
    assert!(
        svg.contains("not created yet"),
        "the refusal's message is listed"
    );
}

/// The colour check can fail: the same pod with no hold has no held bar.
#[test]
fn without_holds_no_held_colour_is_drawn() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = write(
        dir.path(),
        "calls.jsonl",
        &demo_recording("demo", "web", 0, 0),
    );
    let svg_path = dir.path().join("web.svg");
    draw_as(&[], &svg_path, &input);
    let pic = Picture::load(&render_svg(&svg_path).expect("render")).expect("png");
    assert_eq!(pic.count(colour::HELD), SWATCH, "only the legend's swatch");
}

/// A broken file fails the renderer: the check above is not vacuous.
#[test]
fn a_truncated_svg_fails_to_render() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = write(
        dir.path(),
        "calls.jsonl",
        &demo_recording("demo", "web", 3000, 0),
    );
    let svg_path = dir.path().join("web.svg");
    draw_as(&[], &svg_path, &input);
    let svg = std::fs::read_to_string(&svg_path).expect("svg");
    let broken = write(dir.path(), "broken.svg", &svg[..svg.len() / 2]);
    assert!(
        render_svg(&broken).is_err(),
        "rsvg-convert accepted half an SVG"
    );
}

/// Pod and container names are tenant input: markup in them stays text, control characters
/// cannot break the XML, and a huge name does not make a huge file.
#[test]
fn tenant_names_are_escaped_and_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pod = format!(
        "<svg onload=\"alert(1)\">&amp;\u{1}\u{7f}{}",
        "x".repeat(100_000)
    );
    let ns = "ns']]><!--";
    let mut rec = demo_recording(ns, &pod, 500, 0);
    rec.push_str(&event(
        "CreateContainer",
        (ns, &pod, &format!("c<b>\"{}", "y".repeat(50_000))),
        (900, 5, 0),
        (2, "Unknown", &"<msg>&".repeat(10_000)),
    ));
    rec.push('\n');
    let input = write(dir.path(), "calls.jsonl", &rec);
    let svg_path = dir.path().join("t.svg");
    let stdout = draw_as(&[], &svg_path, &input);
    assert!(
        stdout.lines().all(|l| l.chars().count() <= TEXT_WIDTH),
        "{stdout}"
    );
    assert!(
        !stdout.contains('\u{1}'),
        "control characters reach the terminal"
    );
    let svg = std::fs::read_to_string(&svg_path).expect("svg");
    assert!(
        !svg.contains("<svg onload")
            && !svg.contains("<b>")
            && !svg.contains("<msg>")
            && !svg.contains("<!--"),
        "tenant markup in the SVG"
    );
    assert!(svg.len() < 64 << 10, "{} bytes for 11 calls", svg.len());
    render_svg(&svg_path).expect("the escaped SVG renders");
}

/// Several pods: drawn one after another; --svg needs --pod and lists the choices.
#[test]
fn several_pods_are_drawn_or_listed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rec = demo_recording("demo", "web", 1000, 0) + &demo_recording("shop", "cart", 0, 0);
    let input = write(dir.path(), "calls.jsonl", &rec);
    let input = input.to_str().expect("utf-8");
    let out = crisp(&["timeline", input]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        stdout.contains("demo/web — 10 calls") && stdout.contains("shop/cart — 10 calls"),
        "{stdout}"
    );
    let svg = dir.path().join("x.svg");
    let out = crisp(&["timeline", "--svg", svg.to_str().expect("utf-8"), input]);
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--pod")
            && stderr.contains("demo/web (10 calls)")
            && stderr.contains("shop/cart (10 calls)"),
        "{stderr}"
    );
    let out = crisp(&["timeline", "--pod", "nope", input]);
    assert_eq!(out.status.code(), Some(64));
    // From standard input, as `crisp tap --json | crisp timeline` gives it.
    let mut child = Command::new(env!("CARGO_BIN_EXE_crisp"))
        .args(["timeline", "--pod", "cart"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), rec.as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).starts_with("shop/cart"));
}

/// One hold event as `crisp tap -o` records it, for the call `call_id` (the demo recording's
/// ids are its start times in ms).
fn hold_event(call_id: u64, at_ms: i64, phase: &str, probe_result: &str, outcome: &str) -> String {
    let ev = crisp::admin_api::HoldEvent {
        call_id,
        phase: phase.into(),
        unix_nanos: T0 + at_ms * 1_000_000,
        method: "CreateContainer".into(),
        cri_version: "v1".into(),
        pod_namespace: "demo".into(),
        pod_name: "web".into(),
        container_name: "app".into(),
        waiting_on: "proxy".into(),
        reason: "not ready".into(),
        probe: "http://:15021/healthz/ready".into(),
        probe_result: probe_result.into(),
        outcome: outcome.into(),
        ..Default::default()
    };
    json_line(&Event::Hold(ev)).to_string()
}

/// `crisp timeline --sequence` (issue #46): the real binary prints Mermaid text with kubelet's
/// request, the hold's probe rounds and crisp's forward in that order, and its SVG, rendered by
/// librsvg, has the hold's bar on crisp's lane in the held colour and the refusal's answer in
/// the failed colour.
#[test]
fn sequence_draws_the_hold_as_the_gap_before_the_forward() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The app's first CreateContainer (call id 260) is refused; its second starts at 400 ms
    // (call id 400) and is held 3 s. The tap records a refusal as a hold event too.
    let holds = [
        hold_event(260, 261, "refused", "", "refused"),
        hold_event(400, 400, "start", "", ""),
        hold_event(
            400,
            1400,
            "update",
            "connect 10.1.2.3:15021: Connection refused",
            "",
        ),
        hold_event(400, 3400, "end", "", "forwarded"),
    ]
    .join("\n");
    let input = write(
        dir.path(),
        "calls.jsonl",
        &format!("{}{holds}\n", demo_recording("demo", "web", 3000, 1000)),
    );
    let svg_path = dir.path().join("seq.svg");
    let stdout = draw(&["--sequence"], &svg_path, &input);
    assert!(stdout.starts_with("sequenceDiagram\n"), "{stdout}");
    let at = |needle: &str| {
        stdout
            .find(needle)
            .unwrap_or_else(|| panic!("{needle:?} not in:\n{stdout}"))
    };
    let request = at("K->>C: CreateContainer app +400ms");
    let round = at("Note right of C: probe: connect 10.1.2.3:15021: Connection refused +1.40s");
    let forward = at("C->>R: CreateContainer app after 3.00s +3.40s");
    let answer = at("R-->>K: app: OK 3.03s (held 3.00s) +3.43s");
    assert!(
        request < round && round < forward && forward < answer,
        "{stdout}"
    );
    // The refusal is crisp's answer; an unheld call goes straight through.
    at("Note right of C: refused: waiting for proxy: not ready +261ms");
    at("C-->>K: app: FailedPrecondition: crisp: sidecar proxy of pod demo/web");
    at("K->>R: StartContainer proxy +305ms");

    let svg = std::fs::read_to_string(&svg_path).expect("svg written");
    assert!(
        !svg.contains("<script") && !svg.contains("href"),
        "self-contained"
    );
    let png = render_svg(&svg_path).expect("rsvg-convert renders the sequence");
    if let Some(keep) = std::env::var_os("CRISP_SEQUENCE_KEEP") {
        let _ = std::fs::copy(&png, keep);
    }
    let pic = Picture::load(&png).expect("png");
    assert_eq!((pic.width, pic.height), (1100, declared_height(&svg)));
    // Two holds (the app's create, the proxy's stop) as 12 px wide bars, each spanning at least
    // the rows between its request and its forward; the legend's swatch besides.
    let held = pic.count(colour::HELD) - SWATCH;
    let failed = pic.count(colour::FAILED);
    eprintln!("pixels: held {held}, failed {failed}");
    assert!(
        held > 2 * 12 * 26,
        "the holds' bars: {held} px of the held colour"
    );
    assert!(failed > 100, "the refusal's arrow and label: {failed} px");
}
