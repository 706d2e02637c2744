//! Cron schedules as CronJob `spec.schedule` takes them: five fields (minute, hour, day of
//! month, month, day of week) with `*`, `?`, lists, ranges, steps and month/day names, or a
//! macro (`@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly`).
//! When both day fields are restricted a day matches either one, as in Vixie cron. Times
//! are UTC.

use jiff::{Timestamp, ToSpan, Unit, civil::DateTime, tz::TimeZone};

/// A parsed schedule: the allowed values of each field as bit sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    /// Whether day-of-month / day-of-week were `*` (then the other one alone decides).
    any_day: bool,
    any_weekday: bool,
}

/// Why a schedule does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unparseable schedule {schedule:?}: {why}")]
pub struct CronError {
    /// The schedule as given.
    pub schedule: String,
    /// What is wrong with it.
    pub why: String,
}

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const WEEKDAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

impl Schedule {
    /// Parses a schedule.
    pub fn parse(schedule: &str) -> Result<Schedule, CronError> {
        let err = |why: String| CronError {
            schedule: schedule.to_owned(),
            why,
        };
        let expanded = match schedule.trim() {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            other if other.starts_with('@') => return Err(err(format!("unknown macro {other}"))),
            other => other,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(err(format!(
                "expected exactly 5 fields, found {}",
                fields.len()
            )));
        }
        let minutes = field(fields[0], 0, 59, &[]).map_err(&err)?;
        let hours = field(fields[1], 0, 23, &[]).map_err(&err)?;
        let days = field(fields[2], 1, 31, &[]).map_err(&err)?;
        let months = field(fields[3], 1, 12, &MONTHS).map_err(&err)?;
        let mut weekdays = field(fields[4], 0, 7, &WEEKDAYS).map_err(&err)?;
        // 7 is Sunday too.
        if weekdays & (1 << 7) != 0 {
            weekdays |= 1;
        }
        Ok(Schedule {
            minutes,
            hours,
            days,
            months,
            weekdays,
            any_day: matches!(fields[2], "*" | "?"),
            any_weekday: matches!(fields[4], "*" | "?"),
        })
    }

    /// Whether the schedule fires at this minute.
    pub fn matches(&self, t: DateTime) -> bool {
        bit_of(self.minutes, t.minute().into())
            && bit_of(self.hours, t.hour().into())
            && bit_of(self.months, t.month().into())
            && self.day_matches(t)
    }

    /// The first time strictly after `after` at which the schedule fires (within 5 years).
    pub fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        let utc = TimeZone::UTC;
        let start = after.to_zoned(utc.clone()).datetime();
        let mut t = start
            .round(
                jiff::civil::DateTimeRound::new()
                    .smallest(Unit::Minute)
                    .mode(jiff::RoundMode::Trunc),
            )
            .ok()?
            .checked_add(1.minute())
            .ok()?;
        let limit = start.checked_add(5.years()).ok()?;
        while t <= limit {
            if !bit_of(self.months, t.month().into()) {
                // Skip to the first minute of next month.
                t = t
                    .first_of_month()
                    .checked_add(1.month())
                    .ok()?
                    .date()
                    .to_datetime(jiff::civil::Time::midnight());
                continue;
            }
            if self.matches(t) {
                return t.to_zoned(utc).ok().map(|z| z.timestamp());
            }
            if !bit_of(self.hours, t.hour().into()) || !self.day_matches(t) {
                // Skip to the next hour.
                t = t
                    .round(
                        jiff::civil::DateTimeRound::new()
                            .smallest(Unit::Hour)
                            .mode(jiff::RoundMode::Trunc),
                    )
                    .ok()?
                    .checked_add(1.hour())
                    .ok()?;
                continue;
            }
            t = t.checked_add(1.minute()).ok()?;
        }
        None
    }

    fn day_matches(&self, t: DateTime) -> bool {
        let day = bit_of(self.days, t.day().into());
        let weekday = bit_of(self.weekdays, t.weekday().to_sunday_zero_offset().into());
        match (self.any_day, self.any_weekday) {
            (true, true) => true,
            (true, false) => weekday,
            (false, true) => day,
            (false, false) => day || weekday,
        }
    }
}

fn bit_of(set: u64, v: i64) -> bool {
    set & (1 << v) != 0
}

/// One field: comma-separated items, each `*`, `?`, `n`, `a-b`, with an optional `/step`.
fn field(text: &str, min: i64, max: i64, names: &[&str]) -> Result<u64, String> {
    let value = |s: &str| -> Result<i64, String> {
        if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(s)) {
            return Ok(i as i64 + if min == 1 { 1 } else { 0 });
        }
        s.parse::<i64>()
            .map_err(|_| format!("{s:?} is not a number"))
    };
    let mut set = 0u64;
    for item in text.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => (
                r,
                s.parse::<i64>()
                    .ok()
                    .filter(|s| *s > 0)
                    .ok_or_else(|| format!("bad step {s:?}"))?,
            ),
            None => (item, 1),
        };
        let (lo, hi) = match range {
            "*" | "?" => (min, max),
            r => match r.split_once('-') {
                Some((a, b)) => (value(a)?, value(b)?),
                // `n/step` runs from n to the end of the range.
                None if item.contains('/') => (value(r)?, max),
                None => {
                    let v = value(r)?;
                    (v, v)
                }
            },
        };
        if lo < min || hi > max || lo > hi {
            return Err(format!("{item:?} is out of range {min}-{max}"));
        }
        let mut v = lo;
        while v <= hi {
            set |= 1 << v;
            v += step;
        }
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn parses_fields_and_finds_next_times() {
        let every = Schedule::parse("* * * * *").unwrap();
        assert_eq!(
            every.next_after(ts("2026-01-01T10:00:30Z")),
            Some(ts("2026-01-01T10:01:00Z"))
        );
        let five = Schedule::parse("*/5 * * * *").unwrap();
        assert_eq!(
            five.next_after(ts("2026-01-01T10:00:00Z")),
            Some(ts("2026-01-01T10:05:00Z"))
        );
        let weekly = Schedule::parse("30 9 * * mon-fri").unwrap();
        // 2026-01-03 is a Saturday: next is Monday the 5th.
        assert_eq!(
            weekly.next_after(ts("2026-01-03T12:00:00Z")),
            Some(ts("2026-01-05T09:30:00Z"))
        );
        let yearly = Schedule::parse("@yearly").unwrap();
        assert_eq!(
            yearly.next_after(ts("2026-03-01T00:00:00Z")),
            Some(ts("2027-01-01T00:00:00Z"))
        );
        // Both day fields restricted: either matches (the 13th, or any Friday).
        let either = Schedule::parse("0 0 13 * 5").unwrap();
        assert_eq!(
            either.next_after(ts("2026-02-01T00:00:00Z")),
            Some(ts("2026-02-06T00:00:00Z"))
        );
        let feb = Schedule::parse("0 12 1 feb,JUN 7").unwrap();
        assert!(feb.matches("2026-06-01T12:00".parse().unwrap()));
    }

    #[test]
    fn rejects_bad_schedules() {
        for bad in [
            "* * * *",
            "60 * * * *",
            "* * * * 8",
            "*/0 * * * *",
            "@often",
            "a * * * *",
        ] {
            assert!(Schedule::parse(bad).is_err(), "{bad}");
        }
    }
}
