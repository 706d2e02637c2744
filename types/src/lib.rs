//! Shared, I/O-free types used by every minik8s component: label and field selectors (and,
//! as components need them, resource definitions and `Status` helpers).

pub mod selector;

pub use selector::{FieldSelector, LabelSelector, Requirement, SelectorError};
