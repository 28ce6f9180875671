//! The job-mode wire patcher (`crisp::cri::patch::patch_embedded`) — the one place crisp changes
//! response bytes. Checks, beyond "no panic" on arbitrary bytes:
//! 1. structure: the patched message has the same top-level fields in the same order; every
//!    field that was not patched is byte-for-byte the original (unknown fields included), and a
//!    patched one is the original payload plus the fragment;
//! 2. meaning: decoded with prost as the real CRI type (k8s-cri), the patched message equals the
//!    original except `exit_code`/`reason` of the statuses whose id — as kubelet decodes it —
//!    is one crisp terminated. Checked for canonical messages built from arbitrary statuses (plus
//!    unknown fields), and for arbitrary bytes whenever the original decodes.
#![no_main]

use arbitrary::Arbitrary;
use crisp::cri::patch::{completed_fragment, fields, patch_embedded};
use k8s_cri::v1 as cri;
use libfuzzer_sys::fuzz_target;
use prost::Message;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Kind {
    /// ContainerStatusResponse.status (1, singular)
    ContainerStatus,
    /// PodSandboxStatusResponse.containers_statuses (3, repeated)
    SandboxStatus,
    /// ContainerEventResponse.containers_statuses (5, repeated)
    Event,
}

impl Kind {
    fn field(self) -> u32 {
        match self {
            Kind::ContainerStatus => 1,
            Kind::SandboxStatus => 3,
            Kind::Event => 5,
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Status {
    id: u8,
    exit_code: i32,
    reason: String,
    state: u8,
    finished_at: i64,
    label: Option<(String, String)>,
    /// A second `id` field appended to the status (protobuf: the last one wins, and that is the
    /// id kubelet sees).
    shadow: Option<u8>,
}

impl Status {
    fn effective_id(&self) -> &'static str {
        IDS[self.shadow.unwrap_or(self.id) as usize % IDS.len()]
    }

    fn encode(&self) -> Vec<u8> {
        let mut b = status(self).encode_to_vec();
        if let Some(sh) = self.shadow {
            let id = IDS[sh as usize % IDS.len()].as_bytes();
            b.push(0x0a);
            b.push(id.len() as u8);
            b.extend_from_slice(id);
        }
        b
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn put_len_field(out: &mut Vec<u8>, field: u32, payload: &[u8]) {
    put_varint(out, u64::from(field << 3 | 2));
    put_varint(out, payload.len() as u64);
    out.extend_from_slice(payload);
}

const IDS: [&str; 4] = ["a1", "b22", "c333", "d4444"];

fn status(s: &Status) -> cri::ContainerStatus {
    cri::ContainerStatus {
        id: IDS[s.id as usize % IDS.len()].to_string(),
        metadata: Some(cri::ContainerMetadata {
            name: format!("n{}", s.id),
            attempt: 1,
        }),
        state: (s.state % 4) as i32,
        created_at: 1,
        started_at: 2,
        finished_at: s.finished_at,
        exit_code: s.exit_code,
        reason: s.reason.clone(),
        image_ref: "sha256:x".into(),
        labels: s.label.iter().cloned().collect(),
        ..Default::default()
    }
}

#[derive(Arbitrary, Debug)]
enum Input {
    Built {
        kind: Kind,
        statuses: Vec<Status>,
        terminated: u8,
        unknown: Vec<u8>,
    },
    Raw {
        kind: Kind,
        rule: u8,
        bytes: Vec<u8>,
    },
}

/// Like crisp's set of terminated containers, never matches an empty id (a status without an
/// id field decodes to "" for kubelet, and crisp never terminates a container with no id).
fn matcher(rule: u8) -> impl Fn(&str) -> bool {
    move |id: &str| {
        !id.is_empty()
            && match rule % 4 {
                0 => true,
                1 => false,
                2 => id.len() % 2 == 0,
                _ => id.contains('a'),
            }
    }
}

/// The decoded message as a comparable value, with `f` applied to each status first.
fn decoded(
    kind: Kind,
    bytes: &[u8],
    mut f: impl FnMut(&mut cri::ContainerStatus),
) -> Option<String> {
    Some(match kind {
        Kind::ContainerStatus => {
            let mut m = cri::ContainerStatusResponse::decode(bytes).ok()?;
            m.status.iter_mut().for_each(&mut f);
            format!("{m:?}")
        }
        Kind::SandboxStatus => {
            let mut m = cri::PodSandboxStatusResponse::decode(bytes).ok()?;
            m.containers_statuses.iter_mut().for_each(&mut f);
            format!("{m:?}")
        }
        Kind::Event => {
            let mut m = cri::ContainerEventResponse::decode(bytes).ok()?;
            m.containers_statuses.iter_mut().for_each(&mut f);
            format!("{m:?}")
        }
    })
}

fn completed(s: &mut cri::ContainerStatus) {
    s.exit_code = 0;
    s.reason = "Completed".into();
}

/// Wire types the CRI schema declares: `Some(2)` for length-delimited, `Some(0)` for varints;
/// `None` for unknown field numbers (any wire type is fine there).
fn top_level_wire_type(kind: Kind, number: u32) -> Option<u8> {
    match (kind, number) {
        (Kind::ContainerStatus, 1 | 2) => Some(2),
        (Kind::SandboxStatus, 1..=3) => Some(2),
        (Kind::SandboxStatus, 4) => Some(0),
        (Kind::Event, 1 | 4 | 5) => Some(2),
        (Kind::Event, 2 | 3) => Some(0),
        _ => None,
    }
}

fn status_wire_type(number: u32) -> Option<u8> {
    match number {
        3..=7 => Some(0),
        1 | 2 | 8..=19 => Some(2),
        _ => None,
    }
}

/// Whether every known field of the message, and of each status in it, has the wire type the
/// schema declares — what a strict decoder (kubelet's Go protobuf) requires. prost is lax there
/// (a map field sent with another wire type is read as if length-delimited, swallowing the
/// following fields), so for ill-typed bytes prost's reading is not kubelet's and not a
/// reference for what the patch must preserve.
fn well_typed(kind: Kind, bytes: &[u8]) -> bool {
    let Ok(top) = fields(bytes).collect::<Result<Vec<_>, _>>() else {
        return false;
    };
    top.iter().all(|f| {
        if top_level_wire_type(kind, f.number).is_some_and(|w| w != f.wire_type) {
            return false;
        }
        if f.number != kind.field() {
            return true;
        }
        let inner = &bytes[f.payload.0..f.payload.1];
        fields(inner)
            .collect::<Result<Vec<_>, _>>()
            .is_ok_and(|fs| {
                fs.iter()
                    .all(|g| status_wire_type(g.number).is_none_or(|w| w == g.wire_type))
            })
    })
}

/// Check 1, and returns how many fields were patched.
fn same_structure(
    orig: &[u8],
    patched: &[u8],
    field: u32,
    fragment: &[u8],
    matches: &impl Fn(&str) -> bool,
) -> usize {
    let a: Vec<_> = fields(orig)
        .collect::<Result<_, _>>()
        .expect("patch succeeded on a message whose fields do not parse");
    let b: Vec<_> = fields(patched)
        .collect::<Result<_, _>>()
        .expect("the patched message does not parse");
    assert_eq!(a.len(), b.len(), "field count changed");
    let mut n = 0;
    for (x, y) in a.iter().zip(&b) {
        assert_eq!((x.number, x.wire_type), (y.number, y.wire_type));
        let xp = &orig[x.payload.0..x.payload.1];
        let yp = &patched[y.payload.0..y.payload.1];
        let was_patched = x.number == field
            && x.wire_type == 2
            && crisp::cri::patch::string_field(xp, 1).is_some_and(matches);
        if was_patched {
            n += 1;
            assert_eq!(&yp[..xp.len()], xp);
            assert_eq!(&yp[xp.len()..], fragment);
        } else {
            assert_eq!(
                &orig[x.start..x.end],
                &patched[y.start..y.end],
                "an unpatched field changed"
            );
        }
    }
    n
}

fuzz_target!(|input: Input| {
    let fragment = completed_fragment();
    match input {
        Input::Built {
            kind,
            statuses,
            terminated,
            unknown,
        } => {
            // The message without its statuses (prost), then each status appended as its field
            // (repeated fields decode in order; a singular one from its only occurrence).
            let statuses: Vec<&Status> = statuses
                .iter()
                .take(if matches!(kind, Kind::ContainerStatus) {
                    1
                } else {
                    usize::MAX
                })
                .collect();
            let mut bytes = match kind {
                Kind::ContainerStatus => cri::ContainerStatusResponse {
                    status: None,
                    info: [("k".to_string(), "v".to_string())].into(),
                }
                .encode_to_vec(),
                Kind::SandboxStatus => cri::PodSandboxStatusResponse {
                    status: Some(cri::PodSandboxStatus {
                        id: "sb".into(),
                        created_at: 1,
                        ..Default::default()
                    }),
                    timestamp: 7,
                    ..Default::default()
                }
                .encode_to_vec(),
                Kind::Event => cri::ContainerEventResponse {
                    container_id: "a1".into(),
                    container_event_type: 2,
                    ..Default::default()
                }
                .encode_to_vec(),
            };
            for st in &statuses {
                put_len_field(&mut bytes, kind.field(), &st.encode());
            }
            // An unknown length-delimited field from a future CRI (number 1000): must survive.
            bytes.extend_from_slice(&[0xc2, 0x3e]);
            bytes.push(unknown.len().min(127) as u8);
            bytes.extend_from_slice(&unknown[..unknown.len().min(127)]);
            let set = |id: &str| {
                IDS.iter()
                    .position(|x| *x == id)
                    .is_some_and(|i| terminated & (1 << i) != 0)
            };
            let out = patch_embedded(&bytes, kind.field(), &fragment, set)
                .expect("a canonical message must walk");
            match out {
                None => assert!(
                    !statuses.iter().any(|s| set(s.effective_id())),
                    "a terminated status was not patched"
                ),
                Some(p) => {
                    assert!(p.ends_with(&unknown[..unknown.len().min(127)]));
                    same_structure(&bytes, &p, kind.field(), &fragment, &set);
                    let want = decoded(kind, &bytes, |s| {
                        if set(&s.id) {
                            completed(s)
                        }
                    })
                    .expect("canonical decodes");
                    let got =
                        decoded(kind, &p, |_| {}).expect("the patched message does not decode");
                    assert_eq!(got, want);
                }
            }
        }
        Input::Raw { kind, rule, bytes } => {
            let m = matcher(rule);
            let Ok(Some(p)) = patch_embedded(&bytes, kind.field(), &fragment, &m) else {
                return;
            };
            let n = same_structure(&bytes, &p, kind.field(), &fragment, &m);
            assert!(n > 0, "Some(..) without a patched field");
            // Meaning: only when the original is a valid CRI message. A singular field that
            // occurs more than once is merged by protobuf, so which id "the" status has is
            // not a per-occurrence question: those are left to check 1.
            let occurrences = fields(&bytes)
                .filter_map(Result::ok)
                .filter(|f| f.number == kind.field() && f.wire_type == 2)
                .count();
            if matches!(kind, Kind::ContainerStatus) && occurrences > 1 || !well_typed(kind, &bytes)
            {
                return;
            }
            let Some(want) = decoded(kind, &bytes, |s| {
                if m(&s.id) {
                    completed(s)
                }
            }) else {
                return;
            };
            let got = decoded(kind, &p, |_| {})
                .expect("a valid message no longer decodes after the patch");
            assert_eq!(got, want, "the patch changed something else than exit_code/reason of the statuses kubelet sees as terminated");
        }
    }
});
