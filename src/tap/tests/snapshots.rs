//! A tap's snapshot of the runtime (issue #46): crisp's own calls become events that say so
//! (call id 0, `snapshot`), decoded and redacted exactly as a live call of their method is, and
//! a call that failed carries its status.

use std::time::SystemTime;

use bytes::Bytes;

use super::*;
use crate::cri::skim::Skim;
use crate::proxy::client::{ClientError, RawCall};

const STATUS: &str = "/runtime.v1.RuntimeService/Status";

/// A verbose StatusResponse: the runtime's `info` holds its config, with a registry password.
fn verbose_status() -> Vec<u8> {
    k8s_cri::v1::StatusResponse {
        status: Some(k8s_cri::v1::RuntimeStatus {
            conditions: vec![k8s_cri::v1::RuntimeCondition {
                r#type: "RuntimeReady".into(),
                status: true,
                ..Default::default()
            }],
        }),
        info: [(
            "config".to_string(),
            r#"{"registry":{"auths":{"r.example":{"password":"hunter2"}}}}"#.to_string(),
        )]
        .into(),
        ..Default::default()
    }
    .encode_to_vec()
}

fn raw_call(path: &str, answer: Result<Bytes, ClientError>) -> RawCall {
    RawCall {
        path: path.into(),
        request: Bytes::new(),
        start: SystemTime::now(),
        duration: Duration::from_millis(3),
        answer,
    }
}

#[tokio::test]
async fn a_snapshot_status_is_redacted_as_a_live_one() {
    let status = verbose_status();
    // The live call, as the relay hands it to the tap: the response viewed with the tap's spec.
    let t = tap();
    let mut s = t.subscribe(
        Filter {
            full: true,
            include_polling: true,
            ..Default::default()
        },
        8,
    );
    let mut o = outcome(0, Some(b""));
    o.response = Skim::of_framed(
        spec(Some(Rpc::Status), Dir::Response),
        &wire::frame(&status),
    );
    t.on_complete(&call(9, STATUS), &o);
    let Some(Item::Call(live)) = next_now(&mut s).await else {
        panic!("no live event")
    };
    let snap = RawEvent::snapshot(&raw_call(STATUS, Ok(Bytes::from(status.clone()))));
    for redact in [true, false] {
        let (l, p) = (live.to_proto(true, redact), snap.to_proto(true, redact));
        assert_eq!(p.response_json, l.response_json, "redact={redact}");
        assert_eq!(p.request_json, l.request_json, "redact={redact}");
        assert_eq!(p.redacted, redact);
    }
    let p = snap.to_proto(true, true);
    assert!(
        p.response_json.contains("<redacted: "),
        "{}",
        p.response_json
    );
    assert!(!p.response_json.contains("hunter2"), "{}", p.response_json);
    assert!(
        p.response_json.contains("RuntimeReady"),
        "{}",
        p.response_json
    );
    assert!(snap.to_proto(true, false).response_json.contains("hunter2"));
    // What says it is crisp's own call, and what a replay reads.
    assert!(p.snapshot && !live.to_proto(true, true).snapshot);
    assert_eq!(p.call_id, 0);
    assert_eq!(
        (p.method.as_str(), p.path.as_str(), p.cri_version.as_str()),
        ("Status", STATUS, "v1")
    );
    assert_eq!(
        (p.kind.as_str(), p.code, p.code_name.as_str()),
        ("polling", Some(0), "OK")
    );
    assert_eq!(p.response_bytes, status.len() as u64);
    assert_eq!(p.duration_micros, 3_000);
    // Without `full`, sizes only, as a live call.
    assert_eq!(snap.to_proto(false, true).response_json, "");
}

#[test]
fn a_failed_snapshot_call_carries_its_status() {
    let path = "/runtime.v1.RuntimeService/RuntimeConfig";
    let refused = ClientError::Status {
        method: "RuntimeConfig",
        status: crate::status::Status::new(12, "unknown method RuntimeConfig"),
    };
    let p = RawEvent::snapshot(&raw_call(path, Err(refused))).to_proto(true, true);
    assert_eq!((p.code, p.code_name.as_str()), (Some(12), "Unimplemented"));
    assert_eq!(p.message, "unknown method RuntimeConfig");
    assert_eq!((p.response_json.as_str(), p.response_bytes), ("", 0));
    assert!(p.snapshot);
    let late = ClientError::Timeout {
        method: "ImageFsInfo",
        timeout: Duration::from_secs(5),
    };
    let path = "/runtime.v1.ImageService/ImageFsInfo";
    let p = RawEvent::snapshot(&raw_call(path, Err(late))).to_proto(false, true);
    assert_eq!((p.code, p.method.as_str()), (Some(4), "ImageFsInfo"));
    assert!(p.message.contains("no answer within 5s"), "{}", p.message);
}
