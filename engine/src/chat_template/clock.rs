//! `strftime_now(format)` for templates that print today's date (Llama 3.x, Mistral): Python's
//! `datetime.now().strftime(format)`, evaluated in UTC (nodes run in UTC; a model's date line
//! needs no more precision than the day).

use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] =
    ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
const WEEKDAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// A UTC date and time broken into fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DateTime {
    pub year: i64,
    /// 1..=12
    pub month: u32,
    /// 1..=31
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    /// 0 = Monday
    pub weekday: u32,
    /// 1..=366
    pub day_of_year: u32,
}

impl DateTime {
    pub fn now() -> DateTime {
        let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
        DateTime::from_unix(secs)
    }

    /// Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    pub fn from_unix(secs: i64) -> DateTime {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy_mar + 2) / 153;
        let day = (doy_mar - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
        const BEFORE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let day_of_year = BEFORE[month as usize - 1] + day + u32::from(leap && month > 2);
        DateTime {
            year,
            month,
            day,
            hour: (rem / 3600) as u32,
            minute: (rem / 60 % 60) as u32,
            second: (rem % 60) as u32,
            // 1970-01-01 was a Thursday (3).
            weekday: (days + 3).rem_euclid(7) as u32,
            day_of_year,
        }
    }

    /// Formats with the C/Python directives templates use; `%-d`-style (no padding) is accepted
    /// as glibc does. An unknown directive is kept as written, as glibc keeps it.
    pub fn strftime(&self, format: &str) -> String {
        let mut out = String::new();
        let mut chars = format.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let mut spec = chars.next();
            let unpadded = spec == Some('-');
            if unpadded {
                spec = chars.next();
            }
            let num = |n: u32, width: usize| if unpadded { n.to_string() } else { format!("{n:0width$}") };
            let hour12 = if self.hour.is_multiple_of(12) { 12 } else { self.hour % 12 };
            match spec {
                Some('Y') => out.push_str(&self.year.to_string()),
                Some('y') => out.push_str(&num(self.year.rem_euclid(100) as u32, 2)),
                Some('m') => out.push_str(&num(self.month, 2)),
                Some('d') => out.push_str(&num(self.day, 2)),
                Some('e') => out.push_str(&format!("{:>2}", self.day)),
                Some('j') => out.push_str(&num(self.day_of_year, 3)),
                Some('H') => out.push_str(&num(self.hour, 2)),
                Some('I') => out.push_str(&num(hour12, 2)),
                Some('M') => out.push_str(&num(self.minute, 2)),
                Some('S') => out.push_str(&num(self.second, 2)),
                Some('p') => out.push_str(if self.hour < 12 { "AM" } else { "PM" }),
                Some('B') => out.push_str(MONTHS[self.month as usize - 1]),
                Some('b') | Some('h') => out.push_str(&MONTHS[self.month as usize - 1][..3]),
                Some('A') => out.push_str(WEEKDAYS[self.weekday as usize]),
                Some('a') => out.push_str(&WEEKDAYS[self.weekday as usize][..3]),
                Some('u') => out.push_str(&(self.weekday + 1).to_string()),
                Some('w') => out.push_str(&((self.weekday + 1) % 7).to_string()),
                Some('F') => out.push_str(&format!("{}-{:02}-{:02}", self.year, self.month, self.day)),
                Some('T') => out.push_str(&format!("{:02}:{:02}:{:02}", self.hour, self.minute, self.second)),
                Some('Z') => out.push_str("UTC"),
                Some('z') => out.push_str("+0000"),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates_and_formats() {
        let t = DateTime::from_unix(0);
        assert_eq!((t.year, t.month, t.day, t.weekday, t.day_of_year), (1970, 1, 1, 3, 1));
        // 2024-02-29 13:05:09 UTC, a Thursday in a leap year.
        let t = DateTime::from_unix(1_709_211_909);
        assert_eq!((t.year, t.month, t.day, t.hour, t.minute, t.second), (2024, 2, 29, 13, 5, 9));
        assert_eq!(t.strftime("%d %b %Y"), "29 Feb 2024");
        assert_eq!(t.strftime("%A, %B %-d, %Y %I:%M %p %j %%"), "Thursday, February 29, 2024 01:05 PM 060 %");
        assert_eq!(t.strftime("%F %T %Z %q"), "2024-02-29 13:05:09 UTC %q");
        // 2000-12-31 (leap century) is day 366; 1969-12-31 is before the epoch.
        assert_eq!(DateTime::from_unix(978_220_800).strftime("%Y-%m-%d %j %a"), "2000-12-31 366 Sun");
        assert_eq!(DateTime::from_unix(-86_400).strftime("%Y-%m-%d %a"), "1969-12-31 Wed");
    }
}
