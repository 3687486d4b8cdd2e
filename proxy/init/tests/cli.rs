//! The binary as the injected init container runs it: options from the environment the
//! injector sets, `--dry-run` printing the script, bad options refused with the variable named.
//! (The rules applied for real, in a network namespace, are tested in `netns.rs` and in
//! `proxy/tests/capture.rs`.)

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_kinference-proxy-init");

fn run(env: &[(&str, &str)]) -> std::process::Output {
    Command::new(BIN)
        .arg("--dry-run")
        .env_clear()
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

#[test]
fn dry_run_prints_the_script_from_the_injectors_environment() {
    let out = run(&[
        ("KINFERENCE_PROXY_PORT", "4140"),
        ("KINFERENCE_PROXY_UID", "2102"),
        ("KINFERENCE_OUTBOUND_PORTS", "80,8000"),
        ("KINFERENCE_SKIP_OUTBOUND_PORTS", "9000"),
        (
            "KINFERENCE_SKIP_OUTBOUND_CIDRS",
            "10.96.0.0/12,fd00:10:96::/112",
        ),
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "*nat\n\
         :KINFERENCE_OUTPUT - [0:0]\n\
         -A KINFERENCE_OUTPUT -m owner --uid-owner 2102 -j RETURN\n\
         -A KINFERENCE_OUTPUT -o lo -j RETURN\n\
         -A KINFERENCE_OUTPUT -d 127.0.0.0/8 -j RETURN\n\
         -A KINFERENCE_OUTPUT -d 10.96.0.0/12 -j RETURN\n\
         -A KINFERENCE_OUTPUT -p tcp --dport 9000 -j RETURN\n\
         -A KINFERENCE_OUTPUT -p tcp --dport 80 -j REDIRECT --to-ports 4140\n\
         -A KINFERENCE_OUTPUT -p tcp --dport 8000 -j REDIRECT --to-ports 4140\n\
         -A OUTPUT -p tcp -j KINFERENCE_OUTPUT\n\
         COMMIT\n\
         *nat\n\
         :KINFERENCE_OUTPUT - [0:0]\n\
         -A KINFERENCE_OUTPUT -m owner --uid-owner 2102 -j RETURN\n\
         -A KINFERENCE_OUTPUT -o lo -j RETURN\n\
         -A KINFERENCE_OUTPUT -d ::1/128 -j RETURN\n\
         -A KINFERENCE_OUTPUT -d fd00:10:96::/112 -j RETURN\n\
         -A KINFERENCE_OUTPUT -p tcp --dport 9000 -j RETURN\n\
         -A KINFERENCE_OUTPUT -p tcp --dport 80 -j REDIRECT --to-ports 4140\n\
         -A KINFERENCE_OUTPUT -p tcp --dport 8000 -j REDIRECT --to-ports 4140\n\
         -A OUTPUT -p tcp -j KINFERENCE_OUTPUT\n\
         COMMIT\n"
    );
    // With IPv6 off, only the IPv4 table's script.
    let out = run(&[("KINFERENCE_IPV6", "off")]);
    assert!(out.status.success(), "{out:?}");
    let script = String::from_utf8(out.stdout).unwrap();
    assert_eq!(script.matches("*nat").count(), 1, "{script}");
    assert!(!script.contains("::1/128"), "{script}");
}

#[test]
fn empty_variables_mean_defaults_and_all_tcp() {
    let out = run(&[
        ("KINFERENCE_OUTBOUND_PORTS", ""),
        ("KINFERENCE_SKIP_OUTBOUND_PORTS", ""),
        ("KINFERENCE_SKIP_OUTBOUND_CIDRS", ""),
    ]);
    assert!(out.status.success(), "{out:?}");
    let script = String::from_utf8(out.stdout).unwrap();
    assert!(script.contains("--uid-owner 2102 -j RETURN"));
    assert!(script.contains("-A KINFERENCE_OUTPUT -p tcp -j REDIRECT --to-ports 4140\n"));
}

#[test]
fn a_bad_value_names_its_variable() {
    let out = run(&[("KINFERENCE_SKIP_OUTBOUND_CIDRS", "10.0.0.0/40")]);
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("KINFERENCE_SKIP_OUTBOUND_CIDRS"),
        "{stderr}"
    );
    assert!(stderr.contains("10.0.0.0/40"), "{stderr}");
}
