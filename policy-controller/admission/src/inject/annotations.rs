//! The annotations that steer injection, and the parsing of their values. A value that
//! cannot be used is an error that names the annotation, so the pod is refused with a
//! message its owner can act on rather than started with a proxy configured otherwise.

use ipnet::IpNet;
use std::collections::BTreeMap;

/// `enabled` or `disabled`, on a pod (template) or its namespace; the pod's wins.
pub const INJECT: &str = "kinference.io/inject";
/// Added to injected pods: who injected them, and which version.
pub const INJECTED_BY: &str = "kinference.io/injected-by";
/// The proxy's tracing filter, e.g. `debug` or `info,kinference=trace`.
pub const PROXY_LOG_LEVEL: &str = "kinference.io/proxy-log-level";
pub const PROXY_CPU_REQUEST: &str = "kinference.io/proxy-cpu-request";
pub const PROXY_MEMORY_REQUEST: &str = "kinference.io/proxy-memory-request";
pub const PROXY_CPU_LIMIT: &str = "kinference.io/proxy-cpu-limit";
pub const PROXY_MEMORY_LIMIT: &str = "kinference.io/proxy-memory-limit";
/// Comma-separated destination ports redirected to the proxy.
pub const OUTBOUND_PORTS: &str = "kinference.io/outbound-ports";
/// Comma-separated destination ports never redirected.
pub const SKIP_OUTBOUND_PORTS: &str = "kinference.io/skip-outbound-ports";
/// Comma-separated destination CIDRs never redirected.
pub const SKIP_OUTBOUND_CIDRS: &str = "kinference.io/skip-outbound-cidrs";
/// How long a redirected target's stack may stay without a connection before the proxy stops
/// it (`--target-idle-timeout-ms`), as a duration: `90s`, `10m`, `1h`, `500ms`.
pub const PROXY_TARGET_IDLE_TIMEOUT: &str = "kinference.io/proxy-target-idle-timeout";
/// `true` binds the proxy's whole admin listener, `/debug/*` included (decision records,
/// endpoints, policy, dry runs), on the pod's IP rather than on loopback: for a cluster where
/// something else (a NetworkPolicy, a mesh authorization policy) guards it. Default `false`.
pub const PROXY_EXPOSE_ADMIN: &str = "kinference.io/proxy-expose-admin";
/// The label the injector puts on injected pods, valued with the control plane's namespace (as
/// Linkerd's `linkerd.io/control-plane-ns`): the chart's NetworkPolicy admits the pods so labelled
/// to the controller's gRPC port.
pub const CONTROL_PLANE_NS: &str = "kinference.io/control-plane-ns";
/// The label the chart puts on the control plane's own pods.
pub const CONTROL_PLANE_COMPONENT: &str = "kinference.io/control-plane-component";

/// An annotation value that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("annotation {annotation}={value:?} is invalid: {reason}")]
pub struct AnnotationError {
    pub annotation: &'static str,
    pub value: String,
    pub reason: String,
}

fn invalid(annotation: &'static str, value: &str, reason: impl Into<String>) -> AnnotationError {
    AnnotationError {
        annotation,
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// What `kinference.io/inject` asks for.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum InjectMode {
    Enabled,
    Disabled,
}

/// The mode an annotation map asks for, if it has the annotation.
pub fn inject_mode(
    annotations: &BTreeMap<String, String>,
) -> Result<Option<InjectMode>, AnnotationError> {
    match annotations.get(INJECT).map(|v| v.trim()) {
        None => Ok(None),
        Some("enabled") => Ok(Some(InjectMode::Enabled)),
        Some("disabled") => Ok(Some(InjectMode::Disabled)),
        Some(other) => Err(invalid(INJECT, other, "expected enabled or disabled")),
    }
}

/// A comma-separated list of TCP ports (1-65535), in the order given, without repeats.
pub fn ports(annotation: &'static str, value: &str) -> Result<Vec<u16>, AnnotationError> {
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let port = item
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| {
                invalid(
                    annotation,
                    value,
                    format!("{item:?} is not a port (1-65535)"),
                )
            })?;
        if !out.contains(&port) {
            out.push(port);
        }
    }
    Ok(out)
}

/// A comma-separated list of CIDRs (`10.0.0.0/8`, `fd00::/8`, parsed by `ipnet`), normalised to
/// their text.
pub fn cidrs(annotation: &'static str, value: &str) -> Result<Vec<String>, AnnotationError> {
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let net: IpNet = item
            .parse()
            .map_err(|_| invalid(annotation, value, format!("{item:?} is not a CIDR")))?;
        let cidr = net.to_string();
        if !out.contains(&cidr) {
            out.push(cidr);
        }
    }
    Ok(out)
}

/// A Kubernetes resource quantity (`100m`, `0.5`, `64Mi`, `1e3`), checked as the API
/// server's parser would accept it so that the patch is never refused after the fact.
pub fn quantity(annotation: &'static str, value: &str) -> Result<String, AnnotationError> {
    let v = value.trim();
    let bad = || {
        invalid(
            annotation,
            value,
            "not a Kubernetes quantity (e.g. 100m, 0.5, 64Mi)",
        )
    };
    let unsigned = v.strip_prefix('+').unwrap_or(v);
    let number_end = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(number_end);
    let digits = number.replace('.', "");
    if digits.is_empty() || number.matches('.').count() > 1 {
        return Err(bad());
    }
    let suffix_ok = match suffix {
        "" | "n" | "u" | "m" | "k" | "M" | "G" | "T" | "P" | "E" => true,
        "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => true,
        s => match s.strip_prefix(['e', 'E']) {
            Some(exp) => {
                let exp = exp.strip_prefix(['+', '-']).unwrap_or(exp);
                !exp.is_empty() && exp.chars().all(|c| c.is_ascii_digit())
            }
            None => false,
        },
    };
    if !suffix_ok {
        return Err(bad());
    }
    Ok(v.to_string())
}

/// A positive duration written as an integer and a unit, `ms`, `s`, `m` or `h` (`500ms`, `90s`,
/// `10m`, `1h`): the grammar of the chart's `proxy.targetIdleTimeout` and of the annotation.
pub fn parse_duration(value: &str) -> Result<std::time::Duration, String> {
    let v = value.trim();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (number, unit) = v.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{value:?} is not a duration such as 90s, 10m or 1h"))?;
    let ms_per_unit = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => {
            return Err(format!(
                "{value:?} has no unit: write ms, s, m or h (e.g. 10m)"
            ));
        }
    };
    let ms = n
        .checked_mul(ms_per_unit)
        .filter(|ms| *ms > 0)
        .ok_or_else(|| format!("{value:?} must be more than 0 and at most u64 milliseconds"))?;
    Ok(std::time::Duration::from_millis(ms))
}

/// [`parse_duration`], as an annotation's value.
pub fn duration(
    annotation: &'static str,
    value: &str,
) -> Result<std::time::Duration, AnnotationError> {
    parse_duration(value).map_err(|reason| invalid(annotation, value, reason))
}

/// A tracing filter: non-empty, printable, no whitespace (it becomes `RUST_LOG`).
/// `true` or `false`.
pub fn boolean(annotation: &'static str, value: &str) -> Result<bool, AnnotationError> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(invalid(annotation, value, "must be `true` or `false`")),
    }
}

pub fn log_level(value: &str) -> Result<String, AnnotationError> {
    let v = value.trim();
    if v.is_empty() || v.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid(
            PROXY_LOG_LEVEL,
            value,
            "expected a tracing filter such as debug or info,kinference=trace",
        ));
    }
    Ok(v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_parse_in_order_without_repeats() {
        assert_eq!(
            ports(OUTBOUND_PORTS, " 8000, 80,8000,").unwrap(),
            [8000, 80]
        );
        assert_eq!(ports(OUTBOUND_PORTS, "").unwrap(), Vec::<u16>::new());
        let e = ports(OUTBOUND_PORTS, "80,http").unwrap_err();
        assert_eq!(
            e.to_string(),
            "annotation kinference.io/outbound-ports=\"80,http\" is invalid: \"http\" is not a port (1-65535)"
        );
        assert!(ports(OUTBOUND_PORTS, "0").is_err());
        assert!(ports(OUTBOUND_PORTS, "65536").is_err());
    }

    #[test]
    fn durations_need_a_unit_and_must_be_positive() {
        use std::time::Duration;
        for (text, ms) in [
            ("500ms", 500),
            ("90s", 90_000),
            (" 10m ", 600_000),
            ("1h", 3_600_000),
        ] {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_millis(ms)),
                "{text}"
            );
        }
        for bad in [
            "",
            "10",
            "0s",
            "1.5m",
            "-1s",
            "10 m",
            "1d",
            "m",
            "18446744073709551615h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        let e = duration(PROXY_TARGET_IDLE_TIMEOUT, "10").unwrap_err();
        assert_eq!(
            e.to_string(),
            "annotation kinference.io/proxy-target-idle-timeout=\"10\" is invalid: \"10\" has no unit: \
             write ms, s, m or h (e.g. 10m)"
        );
    }

    #[test]
    fn cidrs_are_checked_per_family() {
        assert_eq!(
            cidrs(SKIP_OUTBOUND_CIDRS, "10.0.0.0/8, fd00::/8").unwrap(),
            ["10.0.0.0/8", "fd00::/8"]
        );
        for bad in [
            "10.0.0.0",
            "10.0.0.0/33",
            "fd00::/129",
            "ten/8",
            "10.0.0.0/x",
        ] {
            assert!(cidrs(SKIP_OUTBOUND_CIDRS, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn quantities_follow_the_api_servers_grammar() {
        for good in [
            "100m", "0.5", "1", "64Mi", "2Gi", "1e3", "1.5G", "+2", "250u",
        ] {
            assert_eq!(quantity(PROXY_CPU_REQUEST, good).unwrap(), good);
        }
        for bad in ["", "m", "1.2.3", "64MB", "lots", "-", "1e", "1 Gi"] {
            assert!(quantity(PROXY_CPU_REQUEST, bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn inject_mode_is_enabled_or_disabled() {
        let a = |v: &str| BTreeMap::from([(INJECT.to_string(), v.to_string())]);
        assert_eq!(
            inject_mode(&a("enabled")).unwrap(),
            Some(InjectMode::Enabled)
        );
        assert_eq!(
            inject_mode(&a("disabled")).unwrap(),
            Some(InjectMode::Disabled)
        );
        assert_eq!(inject_mode(&BTreeMap::new()).unwrap(), None);
        assert!(inject_mode(&a("yes")).is_err());
        assert!(log_level("info, debug").is_err());
        assert_eq!(
            log_level("info,kinference=debug").unwrap(),
            "info,kinference=debug"
        );
    }
}
