use super::marks::{write_durably, MarkError, TMP_SUFFIX};
use super::*;

#[test]
fn prestop_exec_is_parsed_and_others_ignored() {
    assert_eq!(
        prestop_command(r#"{"exec":{"command":["sh","-c","sleep 1"]}}"#),
        Some(vec!["sh".into(), "-c".into(), "sleep 1".into()])
    );
    assert_eq!(
        prestop_command(r#"{"httpGet":{"path":"/q","port":80}}"#),
        None
    );
    assert_eq!(prestop_command("not json"), None);
    assert_eq!(prestop_command(r#"{"exec":{"command":[]}}"#), None);
}

/// Issue #26: the preStop annotation is tenant text like any other: over the value cap it
/// is refused unread, however well formed.
#[test]
fn a_prestop_hook_past_the_value_cap_is_not_parsed() {
    let args = vec!["\"x\""; crate::tenant::MAX_VALUE / 4].join(",");
    let hook = format!(r#"{{"exec":{{"command":["sh",{args}]}}}}"#);
    assert!(hook.len() > crate::tenant::MAX_VALUE);
    assert_eq!(prestop_command(&hook), None);
}

#[test]
fn the_grace_annotation_is_bounded_where_it_enters() {
    let grace = |v: &str| grace_of(&[(GRACE_ANNOTATION.to_string(), v.to_string())].into());
    assert_eq!(grace("45"), Duration::from_secs(45));
    assert_eq!(grace("9223372036854775807"), decide::MAX_GRACE);
    assert_eq!(
        grace("18446744073709551615"),
        decide::MAX_GRACE,
        "beyond int64: as long as crisp allows"
    );
    assert_eq!(grace("-5"), Duration::ZERO);
    assert_eq!(grace("soon"), Duration::from_secs(30));
    assert_eq!(grace_of(&Default::default()), Duration::from_secs(30));
}

#[tokio::test]
async fn terminated_marks_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let t = Terminated::open(Some(dir.path().to_path_buf()));
    assert!(t.is_empty());
    t.insert("abc123", "sb1").await.unwrap();
    t.insert("../evil", "sb1").await.unwrap(); // not a container id: never becomes a path
    t.insert("def456", "../evil").await.unwrap(); // nor a sandbox id
    assert!(t.contains("abc123"));
    assert!(!t.contains("def456"));
    let t2 = Terminated::open(Some(dir.path().to_path_buf()));
    assert!(t2.contains("abc123"));
    assert!(t2.may_have_sandbox("sb1"), "the sandbox is read back");
    assert!(!t2.may_have_sandbox("sb2"));
    assert!(!t2.contains("../evil"));
    t2.remove("abc123");
    assert!(t2.is_empty());
    assert!(Terminated::open(Some(dir.path().to_path_buf())).is_empty());
}

/// Issue #37: a mark is written like kubelet's checkpoints — a temporary file, fsynced,
/// renamed, the directory fsynced — so no reader ever sees half a mark, and one a crash
/// left half-written (the temporary file) is neither loaded nor kept.
#[tokio::test]
async fn a_mark_is_written_durably_through_a_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let t = Terminated::open(Some(dir.path().to_path_buf()));
    t.insert("abc123", "sb1").await.unwrap();
    let marks = dir.path().join("terminated");
    assert_eq!(std::fs::read(marks.join("abc123")).unwrap(), b"sb1");
    let names: Vec<String> = std::fs::read_dir(&marks)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, vec!["abc123".to_string()], "no temporary file left");

    // A crash between the write and the rename.
    std::fs::write(marks.join(format!("fed987{TMP_SUFFIX}")), b"sb").unwrap();
    let t2 = Terminated::open(Some(dir.path().to_path_buf()));
    assert!(!t2.contains("fed987"));
    assert!(!marks.join(format!("fed987{TMP_SUFFIX}")).exists());

    // A write that fails says where, and leaves nothing behind.
    let gone = dir.path().join("gone");
    let e = write_durably(&gone, "abc123", b"sb1").unwrap_err();
    assert!(matches!(e, MarkError::Write { .. }), "{e}");
    assert!(e.to_string().contains("gone/abc123"), "{e}");
    // A mark the disk refuses is reported and not kept (issue #43 item 5: no stop follows).
    let other = tempfile::tempdir().unwrap();
    let t3 = Terminated::open(Some(other.path().to_path_buf()));
    std::fs::remove_dir(other.path().join("terminated")).unwrap();
    assert!(t3.insert("abc123", "sb1").await.is_err());
    assert!(!t3.contains("abc123"));
    assert!(t3.check_writable().await.is_err());
}

/// Marks are kept by sandbox: RemovePodSandbox drops them with it; a mark from before crisp
/// kept sandboxes may be any sandbox's until the prune learns its own.
#[tokio::test]
async fn marks_are_kept_by_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let t = Terminated::open(Some(dir.path().to_path_buf()));
    t.insert("a1", "sba").await.unwrap();
    t.insert("a2", "sba").await.unwrap();
    t.insert("b1", "sbb").await.unwrap();
    t.remove_sandbox("sba");
    assert!(!t.contains("a1") && !t.contains("a2") && t.contains("b1"));
    assert!(!t.may_have_sandbox("sba"));
    assert!(!dir.path().join("terminated/a1").exists());

    std::fs::write(dir.path().join("terminated/old1"), b"").unwrap();
    let t = Terminated::open(Some(dir.path().to_path_buf()));
    assert!(
        t.may_have_sandbox("any"),
        "an older mark may be any sandbox's"
    );
    let pruned = t.prune(|id| match id {
        "old1" => Some("sbo".to_string()),
        _ => None,
    });
    assert_eq!(pruned, 1, "b1's container is gone");
    assert!(!t.may_have_sandbox("any"));
    assert!(t.may_have_sandbox("sbo"));
    assert_eq!(
        std::fs::read(dir.path().join("terminated/old1")).unwrap(),
        b"sbo",
        "learnt, and written back"
    );
    assert!(!t.prune_pending(), "pruned once");
}
