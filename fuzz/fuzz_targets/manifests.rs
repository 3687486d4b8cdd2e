//! Manifest files (multi-document YAML) as the policy controller reads, indexes and validates them.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kinference_policy_k8s_index::fuzzing::manifests(data));
