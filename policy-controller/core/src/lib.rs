//! The policy controller's pure index: resources in, outbound and inference policy out.
