//! A small JSON writer (no dependency) and the JSON form of the statistics:
//! [`Snapshot::to_json`], [`PoolStats::to_json`].

use std::fmt::Write;

use super::pool::{Gauge, PoolStats};
use super::stats::{CopyDir, CopyStats, MemStats, Snapshot};

/// Builds one JSON value into a string. Objects and arrays are opened and closed explicitly;
/// commas are inserted as needed.
#[derive(Debug, Default)]
pub struct JsonWriter {
    out: String,
    /// Per open container: whether it has an element yet.
    stack: Vec<bool>,
}

impl JsonWriter {
    /// An empty writer.
    pub fn new() -> Self {
        Self::default()
    }

    fn sep(&mut self) {
        if let Some(has) = self.stack.last_mut() {
            if *has {
                self.out.push(',');
            }
            *has = true;
        }
    }

    /// Writes `"key":` inside an object (the value follows).
    pub fn key(&mut self, k: &str) -> &mut Self {
        self.sep();
        write_str(&mut self.out, k);
        self.out.push(':');
        // The value that follows must not add another comma.
        if let Some(has) = self.stack.last_mut() {
            *has = false;
        }
        self
    }

    fn after_value(&mut self) {
        if let Some(has) = self.stack.last_mut() {
            *has = true;
        }
    }

    /// Opens an object.
    pub fn begin_object(&mut self) -> &mut Self {
        self.sep();
        self.out.push('{');
        self.stack.push(false);
        self
    }

    /// Closes the innermost object.
    pub fn end_object(&mut self) -> &mut Self {
        self.stack.pop();
        self.out.push('}');
        self.after_value();
        self
    }

    /// Opens an array.
    pub fn begin_array(&mut self) -> &mut Self {
        self.sep();
        self.out.push('[');
        self.stack.push(false);
        self
    }

    /// Closes the innermost array.
    pub fn end_array(&mut self) -> &mut Self {
        self.stack.pop();
        self.out.push(']');
        self.after_value();
        self
    }

    /// A string value.
    pub fn string(&mut self, v: &str) -> &mut Self {
        self.sep();
        write_str(&mut self.out, v);
        self.after_value();
        self
    }

    /// An integer value.
    pub fn uint(&mut self, v: u64) -> &mut Self {
        self.sep();
        let _ = write!(self.out, "{v}");
        self.after_value();
        self
    }

    /// A number value (`null` when not finite).
    pub fn float(&mut self, v: f64) -> &mut Self {
        self.sep();
        if v.is_finite() {
            let _ = write!(self.out, "{v}");
        } else {
            self.out.push_str("null");
        }
        self.after_value();
        self
    }

    /// `null`.
    pub fn null(&mut self) -> &mut Self {
        self.sep();
        self.out.push_str("null");
        self.after_value();
        self
    }

    /// `"key": value` for an integer.
    pub fn field_u(&mut self, k: &str, v: u64) -> &mut Self {
        self.key(k).uint(v)
    }

    /// The JSON text.
    pub fn finish(self) -> String {
        self.out
    }
}

fn write_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn gauge(w: &mut JsonWriter, k: &str, g: Gauge) {
    w.key(k).begin_object();
    w.field_u("current", g.current).field_u("peak", g.peak);
    w.end_object();
}

impl PoolStats {
    /// Writes the statistics as one JSON object into `w`.
    pub fn write_json(&self, w: &mut JsonWriter) {
        w.begin_object();
        w.key("label").string(&self.label);
        w.key("kind").string(self.kind.as_str());
        gauge(w, "allocated", self.allocated);
        gauge(w, "requested", self.requested);
        gauge(w, "reserved", self.reserved);
        w.field_u("segments", self.segments)
            .field_u("allocations", self.allocations)
            .field_u("frees", self.frees)
            .field_u("cache_hits", self.cache_hits)
            .field_u("backend_allocs", self.backend_allocs)
            .field_u("backend_frees", self.backend_frees)
            .field_u("free_bytes", self.free_bytes)
            .field_u("largest_free_block", self.largest_free_block);
        w.key("fragmentation").float(self.fragmentation());
        w.field_u("alloc_retries", self.alloc_retries)
            .field_u("ooms", self.ooms)
            .field_u("evictions", self.evictions)
            .field_u("evicted_bytes", self.evicted_bytes);
        w.key("cap");
        match self.cap {
            Some(c) => w.uint(c),
            None => w.null(),
        };
        w.field_u("direct_bytes", self.direct_bytes);
        w.end_object();
    }

    /// The statistics as a JSON object.
    pub fn to_json(&self) -> String {
        let mut w = JsonWriter::new();
        self.write_json(&mut w);
        w.finish()
    }
}

fn mem(w: &mut JsonWriter, m: &MemStats) {
    w.begin_object();
    w.key("label").string(&m.label);
    w.field_u("in_use", m.in_use)
        .field_u("peak", m.peak)
        .field_u("allocs", m.allocs)
        .field_u("frees", m.frees);
    w.end_object();
}

fn copies(w: &mut JsonWriter, c: &CopyStats) {
    w.begin_object();
    for (k, d) in [
        ("host_to_device", c.host_to_device),
        ("device_to_host", c.device_to_host),
        ("device_to_device", c.device_to_device),
    ] {
        let CopyDir { count, bytes } = d;
        w.key(k).begin_object();
        w.field_u("count", count).field_u("bytes", bytes);
        w.end_object();
    }
    w.end_object();
}

impl Snapshot {
    /// Every counter as one JSON object: `host`, `devices`, `copies`, `pools`.
    pub fn to_json(&self) -> String {
        let mut w = JsonWriter::new();
        w.begin_object();
        w.key("host");
        mem(&mut w, &self.host);
        w.key("devices").begin_array();
        for d in &self.devices {
            mem(&mut w, d);
        }
        w.end_array();
        w.key("copies");
        copies(&mut w, &self.copies);
        w.key("pools").begin_array();
        for p in &self.pools {
            p.write_json(&mut w);
        }
        w.end_array();
        w.end_object();
        w.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writer_nests_and_escapes() {
        let mut w = JsonWriter::new();
        w.begin_object();
        w.key("a").uint(1);
        w.key("b").begin_array();
        w.string("x\"y\\z\n").uint(2).null();
        w.begin_object().end_object();
        w.end_array();
        w.key("c").float(0.5);
        w.key("d").float(f64::NAN);
        w.end_object();
        assert_eq!(
            w.finish(),
            r#"{"a":1,"b":["x\"y\\z\n",2,null,{}],"c":0.5,"d":null}"#
        );
        let mut w = JsonWriter::new();
        w.string("\u{1}");
        assert_eq!(w.finish(), r#""\u0001""#);
    }
}
