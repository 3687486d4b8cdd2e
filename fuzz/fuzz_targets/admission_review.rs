//! AdmissionReview bodies as the policy controller's validating webhook answers them.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kinference_policy_admission::fuzzing::admission_review(data)
});
