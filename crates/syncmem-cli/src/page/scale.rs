//! Units of the memory page: byte and time labels, escaping.

/// Byte units: name and size.
const BYTE_UNITS: [(&str, f64); 5] = [
    ("B", 1.0),
    ("KiB", 1024.0),
    ("MiB", 1048576.0),
    ("GiB", 1073741824.0),
    ("TiB", 1099511627776.0),
];

/// The byte unit in which `b` reads as a number below 1024.
fn byte_unit(b: f64) -> (&'static str, f64) {
    let mut u = BYTE_UNITS[0];
    for unit in BYTE_UNITS {
        if b >= unit.1 {
            u = unit;
        }
    }
    u
}

/// `b` bytes as `512 B`, `1.5 MiB`, `12 GiB`.
pub fn bytes(b: u64) -> String {
    let (name, size) = byte_unit(b as f64);
    number(b as f64 / size, name)
}

/// `v` with at most three significant digits, then the unit.
fn number(v: f64, unit: &str) -> String {
    let s = if v == v.trunc() || v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    };
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    format!("{s} {unit}")
}

/// `us` microseconds as `850 µs`, `12.3 ms`, `4.56 s`, `2.5 min`.
pub fn time(us: u64) -> String {
    let v = us as f64;
    if v < 1e3 {
        number(v, "µs")
    } else if v < 1e6 {
        number(v / 1e3, "ms")
    } else if v < 120e6 {
        number(v / 1e6, "s")
    } else {
        number(v / 60e6, "min")
    }
}

/// An `x` value of the axis: a time, or an event number when the trace has no times.
pub fn x_label(x: u64, timed: bool) -> String {
    if timed {
        time(x)
    } else {
        format!("event {x}")
    }
}

/// `s` escaped for HTML text and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 << 20), "3 MiB");
        assert_eq!(bytes(123_456_789), "118 MiB");
        assert_eq!(time(850), "850 µs");
        assert_eq!(time(12_345), "12.3 ms");
        assert_eq!(time(4_560_000), "4.56 s");
        assert_eq!(x_label(7, false), "event 7");
    }

    #[test]
    fn escapes() {
        assert_eq!(esc("<a&\"b\">"), "&lt;a&amp;&quot;b&quot;&gt;");
    }
}
