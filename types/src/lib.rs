//! Shared, I/O-free types used by every minik8s component (resource definitions, selectors, `Status` errors); filled as components need them.
