//! Shared, I/O-free types used by every minik8s component: label and field selectors,
//! resource quantities (and, as components need them, resource definitions and `Status`
//! helpers).

pub mod bootstrap;
pub mod finalizers;
pub mod names;
pub mod quantity;
pub mod selector;
pub mod storage;

pub use quantity::{Quantity, QuantityError};
pub use selector::{FieldSelector, LabelSelector, Requirement, SelectorError};

/// Parses a boolean as Go's `strconv.ParseBool` does, which is how upstream reads boolean
/// query parameters (`1`, `t`, `T`, `TRUE`, `true`, `True`, and the false forms); `None` for
/// anything else.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn booleans_parse_as_go_does() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(super::parse_bool(t), Some(true), "{t}");
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(super::parse_bool(f), Some(false), "{f}");
        }
        for bad in ["", "yes", "tRUE", "2"] {
            assert_eq!(super::parse_bool(bad), None, "{bad}");
        }
    }
}
