//! Pods that come back without the calls crisp orders (issue #45): a restored pod (KEP-5823,
//! kubelet 1.37's RestorePod) whose containers come back CREATED and are only started, and a
//! pod restarted in place (KEP-5532, kubelet 1.36's RestartAllContainersOnContainerExits)
//! whose containers are all killed, removed and created again in the same sandbox.

use super::*;

/// kubelet's StartContainer of container `id` (its request is the id alone).
fn start_req(id: &str) -> Vec<u8> {
    views::ContainerIdRequest {
        container_id: id.into(),
        timeout: 0,
    }
    .encode_to_vec()
}

async fn start_container(engine: &Engine, fake: &Fake, name: &str) -> (Verdict, Duration) {
    run(
        engine,
        &call("StartContainer", KUBELET_DEADLINE),
        &start_req(&id_of(fake, name)),
    )
    .await
}

/// kubelet creates `name` through crisp: the create gate's verdict and hold, and, once it is
/// forwarded, the runtime's new container (running from now, ready at once) and its answer
/// through the engine (`on_response`), as the relay passes it.
async fn created(engine: &Engine, fake: &Fake, name: &str) -> (Verdict, Duration) {
    let call = call("CreateContainer", KUBELET_DEADLINE);
    let req = create(fake, name);
    let (v, held) = run(engine, &call, &req).await;
    if matches!(v, Verdict::Forward) {
        let id = fake.add(name, Some(now()));
        let resp = views::CreateContainerResponse { container_id: id }.encode_to_vec();
        assert!(engine.on_response(&call, &req, Some(&resp), 0).is_none());
    }
    (v, held)
}

/// kubelet's in-place kill and removal of every container of the pod (KEP-5532): each is
/// stopped with no grace (`TerminationGracePeriodSeconds` is not respected, the KEP says), then
/// removed from the runtime.
async fn restart_in_place(engine: &Engine, fake: &Fake) {
    let names: Vec<String> = fake
        .script()
        .containers
        .iter()
        .map(|c| c.name.clone())
        .collect();
    for name in &names {
        let (v, held) = stop_container(engine, fake, name, 0, KUBELET_DEADLINE).await;
        assert_forwarded_at_once(&v, held);
        fake.set(name, |c| {
            c.exited.get_or_insert(now());
        });
    }
    for name in &names {
        let remove = views::ContainerIdRequest {
            container_id: id_of(fake, name),
            timeout: 0,
        }
        .encode_to_vec();
        assert_forward(
            &engine
                .on_request(&call("RemoveContainer", None), &remove)
                .await,
        );
    }
    fake.script().containers.clear();
}

/// KEP-5823: a restored pod's containers are back CREATED, and kubelet calls only
/// StartContainer. The sidecar's start goes at once; the app's waits until the sidecar runs
/// and is ready (5 s after its start), as its create would have.
#[tokio::test(start_paused = true)]
async fn a_restored_apps_start_waits_for_its_sidecar() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    fake.add("proxy", None);
    fake.add("app", None);
    let (v, held) = start_container(&engine, &fake, "proxy").await;
    assert_forwarded_at_once(&v, held);
    let t0 = now();
    fake.set("proxy", |c| {
        c.started = Some(t0);
        c.ready = Some(at(t0, 5 * S));
    });
    let (v, held) = start_container(&engine, &fake, "app").await;
    assert_forward(&v);
    assert_held(held, 5 * S, 100 * MS);
}

/// The same restored pod with its sidecar never started (kubelet started the app first): the
/// app's start is refused as its create would be, with the create gate's reason.
#[tokio::test(start_paused = true)]
async fn a_restored_apps_start_is_refused_while_its_sidecar_does_not_run() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    fake.add("proxy", None);
    fake.add("app", None);
    let (v, held) = start_container(&engine, &fake, "app").await;
    assert_eq!(held, Duration::ZERO);
    assert!(refusal(&v).contains("proxy"), "{v:?}");
}

/// An app crisp saw created (its create gated and forwarded) is started at once, without a
/// runtime read — even if its sidecar is no longer ready by then: no extra latency, no second
/// hold for normal pods.
#[tokio::test(start_paused = true)]
async fn an_app_created_through_crisp_is_started_at_once() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    assert_forwarded_at_once_pair(created(&engine, &fake, "proxy").await);
    assert_forwarded_at_once_pair(created(&engine, &fake, "app").await);
    fake.set("proxy", |c| c.ready = None);
    let lists = fake.script().lists;
    let (v, held) = start_container(&engine, &fake, "app").await;
    assert_forwarded_at_once(&v, held);
    assert_eq!(fake.script().lists, lists, "no runtime read on the start");
}

fn assert_forwarded_at_once_pair((v, held): (Verdict, Duration)) {
    assert_forwarded_at_once(&v, held);
}

/// KEP-5532: the pod is restarted in place (its kill has no grace: forwarded at once, crisp
/// does not order it), and deleted a minute later, its app taking 3 s to exit. That
/// termination gets the pod's whole grace budget: the sidecar's stop is held until the app has
/// exited and forwarded with 27 s of its 30 — not cut short by the in-place kill's budget.
#[tokio::test(start_paused = true)]
async fn a_pod_restarted_in_place_gets_a_new_stop_budget() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    assert_forwarded_at_once_pair(created(&engine, &fake, "proxy").await);
    assert_forwarded_at_once_pair(created(&engine, &fake, "app").await);
    restart_in_place(&engine, &fake).await;
    assert_forwarded_at_once_pair(created(&engine, &fake, "proxy").await);
    assert_forwarded_at_once_pair(created(&engine, &fake, "app").await);

    tokio::time::sleep(60 * S).await;
    let t1 = now();
    assert_forward(
        &stop_container(&engine, &fake, "app", 30, KUBELET_DEADLINE)
            .await
            .0,
    );
    fake.set("app", |c| c.exited = Some(at(t1, 3 * S)));
    let (v, held) = stop_container(&engine, &fake, "proxy", 30, KUBELET_DEADLINE).await;
    assert_held(held, 3 * S, 100 * MS);
    assert_eq!(forwarded_timeout(&v, 30), 27);
}

/// KEP-5532 while the app was being refused: its sidecar had crashed (start timeout 10 s,
/// policy proceed). 20 s later the pod is restarted in place; its new sidecar is created but
/// not started yet. The app's new create is refused for it — the previous run's refusal clock,
/// past the start timeout, must not let it through without its sidecar.
#[tokio::test(start_paused = true)]
async fn a_pod_restarted_in_place_starts_its_refusal_clock_over() {
    let extra = [
        (annotations::START_TIMEOUT, "10s"),
        (annotations::TIMEOUT_POLICY, "proceed"),
    ];
    let (fake, engine) = fake_pod(&["proxy"], &extra);
    assert_forwarded_at_once_pair(created(&engine, &fake, "proxy").await);
    fake.set("proxy", |c| c.exited = Some(now()));
    let (v, _) = created(&engine, &fake, "app").await;
    refusal(&v);
    tokio::time::sleep(20 * S).await;
    restart_in_place(&engine, &fake).await;

    assert_forwarded_at_once_pair(created(&engine, &fake, "proxy").await);
    fake.set("proxy", |c| c.started = None);
    let (v, held) = created(&engine, &fake, "app").await;
    assert_eq!(held, Duration::ZERO);
    assert!(refusal(&v).contains("proxy"), "{v:?}");
}

/// KEP-5532 for a Job pod: crisp stops the sidecar once the app has exited 0; the pod is then
/// restarted in place and runs again. When the app exits again, crisp stops the new sidecar
/// too — the watcher of the first run ended, a new one watches the second.
#[tokio::test(start_paused = true)]
async fn a_job_pod_restarted_in_place_is_watched_again() {
    let fake = Fake::default();
    let engine = pod_with(&fake, &["proxy"], &[(annotations::JOB, "true")], |c| {
        c.ordering.refuse_held_after = Duration::ZERO;
        c.job.poll_interval = 100 * MS;
    });
    assert_forwarded_at_once_pair(created(&engine, &fake, "proxy").await);
    assert_forwarded_at_once_pair(created(&engine, &fake, "app").await);
    fake.set("app", |c| c.exited = Some(now()));
    tokio::time::sleep(2 * S).await;
    assert_eq!(fake.stops().len(), 1, "the first run's sidecar is stopped");

    restart_in_place(&engine, &fake).await;
    assert_forwarded_at_once_pair(created(&engine, &fake, "proxy").await);
    assert_forwarded_at_once_pair(created(&engine, &fake, "app").await);
    fake.set("app", |c| c.exited = Some(now()));
    tokio::time::sleep(2 * S).await;
    assert_eq!(
        fake.stops()
            .iter()
            .map(|(name, _)| name.as_str())
            .collect::<Vec<_>>(),
        ["proxy", "proxy"],
        "the second run's sidecar is stopped too"
    );
}
