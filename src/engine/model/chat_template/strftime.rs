//! `strftime_now(format)` for chat templates: transformers gives templates Python's
//! `datetime.now().strftime(format)` (Granite's and SmolLM3's "Today's Date", Llama 3.2's date string). We
//! format the current UTC time with the same codes, without a date crate; tests fix the moment instead.

use std::time::{SystemTime, UNIX_EPOCH};

/// One moment, broken into the calendar fields strftime prints (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DateTime {
    pub year: i64,
    /// 1..=12
    pub month: u32,
    /// 1..=31
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

impl DateTime {
    /// Midnight of a calendar day.
    pub fn date(year: i64, month: u32, day: u32) -> Self {
        Self { year, month, day, hour: 0, minute: 0, second: 0 }
    }

    /// A `YYYY-MM-DD` day, or `None` when the text is not one.
    pub fn parse_date(text: &str) -> Option<Self> {
        let mut parts = text.splitn(3, '-');
        let year = parts.next()?.parse().ok()?;
        let month = parts.next()?.parse().ok().filter(|m| (1..=12).contains(m))?;
        let day = parts.next()?.parse().ok().filter(|d| (1..=31).contains(d))?;
        Some(Self::date(year, month, day))
    }

    /// The current moment in UTC.
    pub fn now_utc() -> Self {
        let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
        Self::from_unix_secs(secs)
    }

    /// The UTC calendar fields of seconds since 1970-01-01.
    pub fn from_unix_secs(secs: i64) -> Self {
        let days = secs.div_euclid(86_400);
        let of_day = secs.rem_euclid(86_400) as u32;
        let (year, month, day) = civil_from_days(days);
        Self { year, month, day, hour: of_day / 3600, minute: of_day / 60 % 60, second: of_day % 60 }
    }

    /// Days since 1970-01-01.
    fn days(&self) -> i64 {
        // Howard Hinnant's days_from_civil.
        let y = if self.month <= 2 { self.year - 1 } else { self.year };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let m = self.month as i64;
        let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + self.day as i64 - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    }

    fn day_of_year(&self) -> i64 {
        self.days() - Self::date(self.year, 1, 1).days() + 1
    }

    /// Python's `strftime` for the codes templates use: `%Y %y %m %d %e %B %b %h %A %a %H %I %M %S %p %j %%`,
    /// and glibc's `%-d` / `%-m` style unpadded forms; other codes pass through as written.
    pub fn strftime(&self, format: &str) -> String {
        let mut out = String::new();
        let mut chars = format.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let (unpadded, code) = match chars.next() {
                Some('-') => (true, chars.next()),
                other => (false, other),
            };
            let num = |n: i64, width: usize| if unpadded { n.to_string() } else { format!("{n:0width$}") };
            let weekday = (self.days() + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
            let hour12 = if self.hour.is_multiple_of(12) { 12 } else { self.hour % 12 };
            match code {
                Some('Y') => out.push_str(&self.year.to_string()),
                Some('y') => out.push_str(&num(self.year.rem_euclid(100), 2)),
                Some('m') => out.push_str(&num(self.month as i64, 2)),
                Some('d') => out.push_str(&num(self.day as i64, 2)),
                Some('e') => out.push_str(&format!("{:>2}", self.day)),
                Some('B') => out.push_str(MONTHS[self.month as usize - 1]),
                Some('b') | Some('h') => out.push_str(&MONTHS[self.month as usize - 1][..3]),
                Some('A') => out.push_str(WEEKDAYS[weekday]),
                Some('a') => out.push_str(&WEEKDAYS[weekday][..3]),
                Some('H') => out.push_str(&num(self.hour as i64, 2)),
                Some('I') => out.push_str(&num(hour12 as i64, 2)),
                Some('M') => out.push_str(&num(self.minute as i64, 2)),
                Some('S') => out.push_str(&num(self.second as i64, 2)),
                Some('p') => out.push_str(if self.hour < 12 { "AM" } else { "PM" }),
                Some('j') => out.push_str(&num(self.day_of_year(), 3)),
                Some('%') => out.push('%'),
                Some(other) => {
                    out.push('%');
                    if unpadded {
                        out.push('-');
                    }
                    out.push(other);
                }
                None => out.push('%'),
            }
        }
        out
    }
}

/// Howard Hinnant's civil_from_days: (year, month, day) of days since 1970-01-01 (also names run folders).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = (if mp < 10 { mp + 3 } else { mp - 9 }) as u32;
    let year = yoe + era * 400 + if month <= 2 { 1 } else { 0 };
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_the_codes_chat_templates_use_like_python() {
        // datetime(2025, 3, 7, 14, 5, 9).strftime(...) in Python.
        let t = DateTime { hour: 14, minute: 5, second: 9, ..DateTime::date(2025, 3, 7) };
        assert_eq!(t.strftime("%d %B %Y"), "07 March 2025");
        assert_eq!(t.strftime("%B %d, %Y"), "March 07, 2025");
        assert_eq!(t.strftime("%d %b %Y"), "07 Mar 2025");
        assert_eq!(t.strftime("%A %a %y-%m-%d %j"), "Friday Fri 25-03-07 066");
        assert_eq!(t.strftime("%H:%M:%S %I %p %-d/%-m 100%% %Q"), "14:05:09 02 PM 7/3 100% %Q");
    }

    #[test]
    fn unix_seconds_become_utc_calendar_fields() {
        assert_eq!(DateTime::from_unix_secs(0), DateTime::date(1970, 1, 1));
        // 2024-02-29T23:59:59Z, a leap day.
        let t = DateTime::from_unix_secs(1_709_251_199);
        assert_eq!((t.year, t.month, t.day, t.hour, t.minute, t.second), (2024, 2, 29, 23, 59, 59));
        assert_eq!(DateTime::from_unix_secs(1_709_251_200), DateTime::date(2024, 3, 1));
        assert_eq!(DateTime::parse_date("2025-03-07"), Some(DateTime::date(2025, 3, 7)));
        assert_eq!(DateTime::parse_date("2025-13-07"), None);
        assert!(DateTime::now_utc().year >= 2025);
    }
}
