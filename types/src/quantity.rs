//! Resource quantities (`500m`, `1.5`, `128Mi`, `1e3`) as exact milli-units, for sums and
//! comparisons (scheduler fit, quota, limit ranges).

use std::fmt;

/// A quantity in thousandths of its unit (cpu: millicores; memory: milli-bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity(pub i128);

/// A string that is not a Kubernetes quantity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantityError(pub String);

impl fmt::Display for QuantityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {:?}",
            self.0
        )
    }
}

impl std::error::Error for QuantityError {}

const BINARY: [(&str, u32); 6] = [
    ("Ki", 1),
    ("Mi", 2),
    ("Gi", 3),
    ("Ti", 4),
    ("Pi", 5),
    ("Ei", 6),
];

impl Quantity {
    /// Zero.
    pub const ZERO: Quantity = Quantity(0);

    /// A whole number of units.
    pub fn from_units(n: i64) -> Self {
        Quantity(n as i128 * 1000)
    }

    /// Thousandths of the unit, rounded up as upstream's `MilliValue`.
    pub fn millis(self) -> i128 {
        self.0
    }

    /// Whole units, rounded up as upstream's `Value`.
    pub fn units(self) -> i128 {
        (self.0 + 999).div_euclid(1000)
    }

    /// Parses a quantity string; fractions below a milli-unit round up.
    pub fn parse(s: &str) -> Result<Self, QuantityError> {
        let err = || QuantityError(s.to_owned());
        let s = s.trim();
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
            .unwrap_or(s.len());
        let (num, suffix) = s.split_at(split);
        if num.is_empty() {
            return Err(err());
        }
        let (neg, num) = match num.as_bytes()[0] {
            b'-' => (true, &num[1..]),
            b'+' => (false, &num[1..]),
            _ => (false, num),
        };
        let (int, frac) = num.split_once('.').unwrap_or((num, ""));
        if int.is_empty() && frac.is_empty()
            || !int.bytes().all(|b| b.is_ascii_digit())
            || !frac.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(err());
        }
        // The value as digits × 10^exp10 × 2^exp2.
        let digits: String = format!("{int}{frac}");
        let mut mantissa: i128 = if digits.is_empty() {
            0
        } else {
            digits.parse().map_err(|_| err())?
        };
        let mut exp10: i32 = -(frac.len() as i32);
        let mut exp2: u32 = 0;
        match suffix {
            "" => {}
            "n" => exp10 -= 9,
            "u" => exp10 -= 6,
            "m" => exp10 -= 3,
            "k" => exp10 += 3,
            "M" => exp10 += 6,
            "G" => exp10 += 9,
            "T" => exp10 += 12,
            "P" => exp10 += 15,
            "E" => exp10 += 18,
            s if s.starts_with(['e', 'E']) => {
                exp10 += s[1..].parse::<i32>().map_err(|_| err())?;
            }
            s => {
                let (_, p) = BINARY.iter().find(|(n, _)| *n == s).ok_or_else(err)?;
                exp2 = 10 * p;
            }
        }
        // To milli-units.
        exp10 += 3;
        mantissa = mantissa.checked_mul(1i128 << exp2).ok_or_else(err)?;
        if exp10 >= 0 {
            mantissa = mantissa
                .checked_mul(10i128.checked_pow(exp10 as u32).ok_or_else(err)?)
                .ok_or_else(err)?;
        } else {
            let d = 10i128.checked_pow((-exp10) as u32).unwrap_or(i128::MAX);
            mantissa = (mantissa + d - 1) / d;
        }
        Ok(Quantity(if neg { -mantissa } else { mantissa }))
    }
}

impl std::str::FromStr for Quantity {
    type Err = QuantityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quantity::parse(s)
    }
}

impl std::ops::Add for Quantity {
    type Output = Quantity;
    fn add(self, o: Quantity) -> Quantity {
        Quantity(self.0 + o.0)
    }
}

impl std::ops::AddAssign for Quantity {
    fn add_assign(&mut self, o: Quantity) {
        self.0 += o.0;
    }
}

impl std::ops::Sub for Quantity {
    type Output = Quantity;
    fn sub(self, o: Quantity) -> Quantity {
        Quantity(self.0 - o.0)
    }
}

impl std::iter::Sum for Quantity {
    fn sum<I: Iterator<Item = Quantity>>(iter: I) -> Quantity {
        Quantity(iter.map(|q| q.0).sum())
    }
}

/// Canonical form: whole units with a binary suffix when exact (`128Mi`), else decimal
/// units, else millis (`500m`).
impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        if m % 1000 != 0 {
            return write!(f, "{m}m");
        }
        let n = m / 1000;
        if n != 0 && n % 1024 == 0 {
            let mut v = n;
            let mut i = 0;
            while v % 1024 == 0 && i < BINARY.len() {
                v /= 1024;
                i += 1;
            }
            return write!(f, "{v}{}", BINARY[i - 1].0);
        }
        write!(f, "{n}")
    }
}

#[cfg(test)]
mod tests {
    use super::Quantity;

    fn q(s: &str) -> i128 {
        Quantity::parse(s).unwrap().millis()
    }

    #[test]
    fn parses_the_upstream_forms() {
        assert_eq!(q("1"), 1000);
        assert_eq!(q("500m"), 500);
        assert_eq!(q("0.5"), 500);
        assert_eq!(q(".5"), 500);
        assert_eq!(q("1.5"), 1500);
        assert_eq!(q("1Ki"), 1024 * 1000);
        assert_eq!(q("128Mi"), 128 * 1024 * 1024 * 1000);
        assert_eq!(q("1k"), 1_000_000);
        assert_eq!(q("1e3"), 1_000_000);
        assert_eq!(q("1G"), 1_000_000_000_000);
        assert_eq!(q("1n"), 1, "fractions of a milli round up");
        assert_eq!(q("-2"), -2000);
        assert!(Quantity::parse("abc").is_err());
        assert!(Quantity::parse("1Xi").is_err());
        assert!(Quantity::parse("").is_err());
    }

    #[test]
    fn displays_canonically() {
        assert_eq!(Quantity::parse("500m").unwrap().to_string(), "500m");
        assert_eq!(Quantity::parse("2").unwrap().to_string(), "2");
        assert_eq!(Quantity::parse("1024Mi").unwrap().to_string(), "1Gi");
        assert_eq!(Quantity::parse("0").unwrap().to_string(), "0");
        assert_eq!(Quantity::parse("1.5").unwrap().to_string(), "1500m");
    }
}
