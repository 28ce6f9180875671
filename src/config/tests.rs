use super::*;

#[test]
fn empty_file_gives_defaults() {
    let c = Config::from_toml("", "t").unwrap();
    assert_eq!(c.listen, PathBuf::from(DEFAULT_LISTEN));
    assert_eq!(c.upstream, PathBuf::from(DEFAULT_UPSTREAM));
    assert_eq!(c.listen_mode, 0o660);
    assert_eq!(c.ordering.start_timeout, Duration::from_secs(90));
}

#[test]
fn full_file_parses() {
    let c = Config::from_toml(
        r#"
listen = "/tmp/x.sock"
listen_mode = "0600"
upstream = "/tmp/y.sock"
[log]
level = "crisp=debug"
format = "json"
[proxy]
shutdown_grace = "3s"
[ordering]
start_timeout = "1m30s"
timeout_policy = "fail"
[[sidecars]]
name = "istio-proxy"
ready = "http://:15021/healthz/ready"
[[sidecars]]
name = "linkerd-proxy"
"#,
        "t",
    )
    .unwrap();
    assert_eq!(c.listen_mode, 0o600);
    assert_eq!(c.log.format, LogFormat::Json);
    assert_eq!(c.proxy.shutdown_grace, Duration::from_secs(3));
    assert_eq!(c.ordering.start_timeout, Duration::from_secs(90));
    assert_eq!(c.ordering.timeout_policy, TimeoutPolicy::Fail);
    assert_eq!(c.sidecars[1].ready, "running");
}

fn err(text: &str) -> String {
    Config::from_toml(text, "cfg.toml").unwrap_err().to_string()
}

/// Every bad key or value is refused with an error that names it (and, where given, says why).
#[test]
fn bad_keys_and_values_are_named() {
    let cases: &[(&str, &str, &str)] = &[
        ("[proxy]\nshutdown_grcae = \"1s\"\n", "shutdown_grcae", ""),
        ("lisen = \"/x\"\n", "lisen", ""),
        ("[ordering]\nstart_timeout = \"ninety\"\n", "ordering.start_timeout", ""),
        ("[ordering]\nstart_timeout = \"5m\"\n", "ordering.start_timeout", "too long"),
        ("[ordering]\ntimeout_policy = \"maybe\"\n", "ordering.timeout_policy", ""),
        ("listen_mode = \"999\"\n", "listen_mode", ""),
        ("[[sidecars]]\nname = \"a\"\n[[sidecars]]\nname = \"a\"\n", "sidecars[1].name", ""),
        ("[log]\nlevel = \"crisp=loud\"\n", "log.level", ""),
        ("[admin]\nsokcet = \"/x\"\n", "sokcet", ""),
        ("[admin]\nmetrics_tcp = \"localhost\"\n", "admin.metrics_tcp", ""),
        ("[admin]\nmode = \"0999\"\n", "admin.mode", ""),
        ("listen = \"/run/crisp/admin.sock\"\n", "admin.socket", ""),
        ("[admin]\ntap_queue = 0\n", "admin.tap_queue", ""),
        ("[[injectors]]\nname = \"x\"\nwhen = [\"a\"]\n[[injectors.sidecars]]\nname = \"p\"\nready = \"htp://:1\"\n", "injectors[0].sidecars[0].ready", ""),
        ("[[injectors]]\nname = \"x\"\nwhen = []\n", "injectors[0].when", ""),
        ("[ordering]\nprobe_allow = [\"10.0.0.1/8\"]\n", "ordering.probe_allow", "host bits"),
        ("[ordering]\nprobe_allow = [\"10.0.0.0/8\", \"nonsense\"]\n", "ordering.probe_allow", "entry 1"),
        ("[ordering]\nprobe_allow = \"10.0.0.0/8\"\n", "ordering.probe_allow", ""),
        ("[ordering]\nmax_probes_in_flight = 0\n", "ordering.max_probes_in_flight", "between 1 and"),
        ("[ordering]\nmax_probes_in_flight = 100000\n", "ordering.max_probes_in_flight", "between 1 and"),
        ("[ordering]\nprobe_connects_per_second = 0\n", "ordering.probe_connects_per_second", "between 1 and"),
        ("[ordering]\nruntime_reads_per_second = 0\n", "ordering.runtime_reads_per_second", "between 1 and"),
        ("[ordering]\nruntime_reads_per_second = 1000000\n", "ordering.runtime_reads_per_second", "between 1 and"),
        ("[ordering]\nmax_runtime_reads_in_flight = 0\n", "ordering.max_runtime_reads_in_flight", "between 1 and"),
        ("[ordering]\nprobe_timeout = \"0s\"\n", "ordering.probe_timeout", "greater than 0"),
        ("[ordering]\nrefuse_held_after = \"500ms\"\n", "ordering.refuse_held_after", "too short"),
    ];
    for (text, key, what) in cases {
        let e = err(text);
        assert!(e.contains(key) && e.contains(what), "{text}: {e}");
    }
}

#[test]
fn durations() {
    assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
    assert_eq!(parse_duration("100ms"), Ok(Duration::from_millis(100)));
    assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
    assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
    assert!(parse_duration("90").is_err());
    assert!(parse_duration("s").is_err());
    assert!(parse_duration("5 years").is_err());
    assert!(parse_duration("").is_err());
    assert!(parse_duration("1e400s").is_err());
}

/// Issue #33: a group- or world-accessible admin socket needs an explicit opt-in.
#[test]
fn a_shared_admin_mode_needs_the_opt_in() {
    for mode in ["0660", "0666", "0606", "0640"] {
        let text = format!("[admin]\nmode = \"{mode}\"\n");
        let e = err(&text);
        assert!(
            e.contains("admin.mode") && e.contains("admin.allow_shared_mode = true"),
            "{text}: {e}"
        );
        let c = Config::from_toml(&format!("{text}allow_shared_mode = true\n"), "t").unwrap();
        assert!(c.admin.shared() && c.admin.allow_shared_mode, "{text}");
    }
    for mode in ["0600", "0700"] {
        let c = Config::from_toml(&format!("[admin]\nmode = \"{mode}\"\n"), "t").unwrap();
        assert!(!c.admin.shared(), "{mode}");
    }
    // A disabled admin socket has no mode to refuse.
    assert!(Config::from_toml("[admin]\nenabled = false\nmode = \"0666\"\n", "t").is_ok());
}

/// Issue #44: `admin.group` names a group by name or gid; a name no group has is refused at
/// start, naming it. `admin.tap_memory_bytes` has a floor.
#[test]
fn the_admin_group_must_exist_and_tap_memory_has_a_floor() {
    let e = err("[admin]\ngroup = \"crisp-no-such-group\"\n");
    assert!(
        e.contains("admin.group") && e.contains("\"crisp-no-such-group\""),
        "{e}"
    );
    let c = Config::from_toml("[admin]\ngroup = \"4242\"\n", "t").unwrap();
    assert_eq!(c.admin.group_id(), Ok(Some(4242)));
    let c = Config::from_toml("[admin]\ngroup = \"root\"\n", "t").unwrap();
    assert_eq!(c.admin.group_id(), Ok(Some(0)));
    assert_eq!(
        Config::from_toml("", "t").unwrap().admin.group_id(),
        Ok(None)
    );
    let e = err("[admin]\ntap_memory_bytes = 1000\n");
    assert!(
        e.contains("admin.tap_memory_bytes") && e.contains("1000"),
        "{e}"
    );
    let c = Config::from_toml("[admin]\ntap_memory_bytes = 1048576\n", "t").unwrap();
    assert_eq!(c.admin.tap_memory_bytes, 1 << 20);
    assert_eq!(
        Config::from_toml("", "t").unwrap().admin.tap_memory_bytes,
        256 << 20
    );
}

#[test]
fn admin_defaults_next_to_listen() {
    let c = Config::from_toml("", "t").unwrap();
    assert!(c.admin.enabled);
    assert_eq!(c.admin.mode, 0o600);
    assert_eq!(c.admin.metrics_tcp, None);
    assert_eq!(c.admin_socket(), PathBuf::from("/run/crisp/admin.sock"));
    let c = Config::from_toml("listen = \"/tmp/t/crisp.sock\"\n", "t").unwrap();
    assert_eq!(c.admin_socket(), PathBuf::from("/tmp/t/admin.sock"));
}

#[test]
fn admin_section_parses() {
    let c = Config::from_toml("[admin]\nsocket = \"/run/x/a.sock\"\nmode = \"0660\"\nallow_shared_mode = true\nmetrics_tcp = \"127.0.0.1:9478\"\ntap_queue = 10\n", "t").unwrap();
    assert_eq!(c.admin_socket(), PathBuf::from("/run/x/a.sock"));
    assert_eq!(c.admin.mode, 0o660);
    assert_eq!(c.admin.metrics_tcp, Some("127.0.0.1:9478".parse().unwrap()));
    assert_eq!(c.admin.tap_queue, 10);
    assert!(
        !Config::from_toml("[admin]\nenabled = false\n", "t")
            .unwrap()
            .admin
            .enabled
    );
}

#[test]
fn injectors_extend_the_builtin_table_and_are_validated() {
    let c = Config::from_toml(
        "[[injectors]]\nname = \"consul\"\nwhen = [\"consul.hashicorp.com/connect-inject-status\"]\ninit_containers = [\"consul-connect-inject-init\"]\n[[injectors.sidecars]]\nname = \"consul-dataplane\"\nalways = false\n\n[[injectors]]\nname = \"vault-agent\"\nenabled = false\nwhen = []\n",
        "t",
    )
    .unwrap();
    let names: Vec<String> = c.injector_table().into_iter().map(|r| r.name).collect();
    assert_eq!(names, vec!["istio", "linkerd", "consul"]);
    let c = Config::from_toml("[ordering]\nknown_injectors = false\n", "t").unwrap();
    assert!(c.injector_table().is_empty());
}

#[test]
fn runtime_reads_are_bounded_by_default() {
    let c = Config::from_toml("", "t").unwrap();
    assert_eq!(
        (
            c.ordering.runtime_reads_per_second,
            c.ordering.max_runtime_reads_in_flight
        ),
        (100, 16)
    );
    let c = Config::from_toml(
        "[ordering]\nruntime_reads_per_second = 20\nmax_runtime_reads_in_flight = 4\n",
        "t",
    )
    .unwrap();
    assert_eq!(
        (
            c.ordering.runtime_reads_per_second,
            c.ordering.max_runtime_reads_in_flight
        ),
        (20, 4)
    );
}

#[test]
fn probe_allow_and_probe_bounds() {
    let c = Config::from_toml("", "t").unwrap();
    assert!(
        c.ordering.probe_allow.is_empty(),
        "pods may aim only at themselves by default"
    );
    assert_eq!(
        (
            c.ordering.max_probes_in_flight,
            c.ordering.probe_connects_per_second
        ),
        (64, 200)
    );
    let c = Config::from_toml("[ordering]\nprobe_allow = [\"10.0.0.0/8\", \"fd00::/8\", \"192.0.2.7\"]\nmax_probes_in_flight = 8\nprobe_connects_per_second = 50\n", "t").unwrap();
    let shown: Vec<String> = c
        .ordering
        .probe_allow
        .iter()
        .map(|c| c.to_string())
        .collect();
    assert_eq!(shown, ["10.0.0.0/8", "fd00::/8", "192.0.2.7/32"]);
    assert!(c.ordering.probe_allow[0].contains("10.3.4.5".parse().unwrap()));
    assert_eq!(
        (
            c.ordering.max_probes_in_flight,
            c.ordering.probe_connects_per_second
        ),
        (8, 50)
    );
    let many: Vec<String> = (0..=MAX_PROBE_ALLOW)
        .map(|i| format!("\"10.{}.{}.0/24\"", i / 256, i % 256))
        .collect();
    let e = err(&format!("[ordering]\nprobe_allow = [{}]\n", many.join(",")));
    assert!(
        e.contains("ordering.probe_allow") && e.contains("more than"),
        "{e}"
    );
}

#[test]
fn refuse_held_after_parses_turns_off_and_is_bounded() {
    assert_eq!(
        Config::default().ordering.refuse_held_after,
        Duration::from_secs(30)
    );
    let c = Config::from_toml("[ordering]\nrefuse_held_after = \"45s\"\n", "t").unwrap();
    assert_eq!(c.ordering.refuse_held_after, Duration::from_secs(45));
    let c = Config::from_toml("[ordering]\nrefuse_held_after = \"0s\"\n", "t").unwrap();
    assert!(
        c.ordering.refuse_held_after.is_zero(),
        "0s: never refuse a hold"
    );
}

/// Issue #26: an operator's injector rule names containers as Kubernetes does.
#[test]
fn injector_rules_name_containers_as_kubernetes_does() {
    let e = err(
        "[[injectors]]\nname = \"x\"\nwhen = [\"a\"]\n[[injectors.sidecars]]\nname = \"Proxy_1\"\n",
    );
    assert!(
        e.contains("injectors[0].sidecars[0].name") && e.contains("DNS-1123"),
        "{e}"
    );
    let e = err(
        "[[injectors]]\nname = \"x\"\nwhen = [\"a\"]\ninit_containers = [\"ok\", \"not ok\"]\n",
    );
    assert!(
        e.contains("injectors[0].init_containers[1]") && e.contains("DNS-1123"),
        "{e}"
    );
}

/// `[readiness] shared_kernel_handlers` (issue #35): the default lists the runtime's default
/// handler, runc and crun; each entry must be `""` or a DNS-1123 label, at most 64 of them.
#[test]
fn readiness_handlers_are_validated() {
    let c = Config::from_toml("", "t").unwrap();
    assert_eq!(c.readiness.shared_kernel_handlers, ["", "runc", "crun"]);
    let c = Config::from_toml("[readiness]\nshared_kernel_handlers = [\"runc\"]\n", "t").unwrap();
    assert_eq!(c.readiness.shared_kernel_handlers, ["runc"]);
    for bad in [
        "\"Kata\"",
        "\"runc \"",
        "\"a\\nb\"",
        &format!("\"{}\"", "a".repeat(64)),
    ] {
        let e = err(&format!("[readiness]\nshared_kernel_handlers = [{bad}]\n"));
        assert!(
            e.contains("readiness.shared_kernel_handlers") && e.contains("not a runtime handler"),
            "{bad}: {e}"
        );
        assert!(!e.contains('\n'), "escaped: {e:?}");
    }
    let many: Vec<String> = (0..=MAX_SHARED_KERNEL_HANDLERS)
        .map(|i| format!("\"h{i}\""))
        .collect();
    let e = err(&format!(
        "[readiness]\nshared_kernel_handlers = [{}]\n",
        many.join(",")
    ));
    assert!(e.contains("more than 64 handlers"), "{e}");
}

#[test]
fn tracing_is_off_by_default_and_its_endpoint_is_checked() {
    let c = Config::from_toml("", "t").unwrap();
    assert_eq!(c.tracing, TracingConfig::default());
    assert_eq!(c.tracing.otlp_endpoint, None);
    let c = Config::from_toml(
        "[tracing]\notlp_endpoint = \"http://127.0.0.1:4317\"\nexport_delay = \"1s\"\n",
        "t",
    )
    .unwrap();
    assert_eq!(
        c.tracing.otlp_endpoint.as_deref(),
        Some("http://127.0.0.1:4317")
    );
    assert_eq!(c.tracing.export_delay, Duration::from_secs(1));
    for (toml, key) in [
        (
            "otlp_endpoint = \"https://collector:4317\"",
            "tracing.otlp_endpoint",
        ),
        (
            "otlp_endpoint = \"collector:4317\"",
            "tracing.otlp_endpoint",
        ),
        (
            "otlp_endpoint = \"http://c:4318/v1/traces\"",
            "tracing.otlp_endpoint",
        ),
        ("export_delay = \"0s\"", "tracing.export_delay"),
        ("export_delay = \"2m\"", "tracing.export_delay"),
        ("sample = true", "tracing.sample"),
    ] {
        match Config::from_toml(&format!("[tracing]\n{toml}\n"), "t") {
            Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key, "{toml}"),
            other => panic!("{toml}: {other:?}"),
        }
    }
}
