//! Shared, I/O-free types used by every minik8s component: label and field selectors,
//! resource quantities (and, as components need them, resource definitions and `Status`
//! helpers).

pub mod names;
pub mod quantity;
pub mod selector;

pub use quantity::{Quantity, QuantityError};
pub use selector::{FieldSelector, LabelSelector, Requirement, SelectorError};
