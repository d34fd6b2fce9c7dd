//! A streaming writer of Python pickles, protocol 3, for plain data: dicts with string keys,
//! lists, ints, strings and bools.
//!
//! Only the opcodes that PyTorch's memory viewer (`MemoryViz.js`, which reads protocols 2 to 4
//! only) and Python's `pickle` both read are written: `PROTO 3`, `EMPTY_DICT`, `EMPTY_LIST`,
//! `MARK`, `SETITEMS`, `APPENDS`, `BININT1`, `BININT2`, `BININT`, `LONG1`, `BINUNICODE`,
//! `NEWTRUE`, `NEWFALSE`, `BINPUT`, `LONG_BINPUT`, `BINGET`, `LONG_BINGET` and `STOP`.
//! Strings are memoized (written once, then fetched), which keeps repeated keys and names
//! small. Items are appended in batches of 1000, as Python's own pickler does: the viewer
//! spreads each batch into a function call, which a list of a million entries would overflow.

use std::collections::HashMap;
use std::io::{self, Write};

const PROTO: u8 = 0x80;
const STOP: u8 = b'.';
const MARK: u8 = b'(';
const EMPTY_DICT: u8 = b'}';
const EMPTY_LIST: u8 = b']';
const SETITEMS: u8 = b'u';
const APPENDS: u8 = b'e';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const BININT: u8 = b'J';
const LONG1: u8 = 0x8a;
const BINUNICODE: u8 = b'X';
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const BINPUT: u8 = b'q';
const LONG_BINPUT: u8 = b'r';
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';

/// Items per `MARK ... APPENDS` or `MARK ... SETITEMS` batch.
const BATCH: usize = 1000;

/// One open container: how many items it holds in the current batch.
struct Open {
    items: usize,
    dict: bool,
}

/// Writes one pickled value to `W`: call [`Pickler::dict`] / [`Pickler::list`], the items
/// (for a dict: a [`Pickler::key`] before each value), [`Pickler::end`] for each container,
/// then [`Pickler::finish`].
pub(crate) struct Pickler<W: Write> {
    out: W,
    memo: HashMap<String, u32>,
    open: Vec<Open>,
}

impl<W: Write> Pickler<W> {
    /// Starts a pickle (protocol 3).
    pub(crate) fn new(mut out: W) -> io::Result<Self> {
        out.write_all(&[PROTO, 3])?;
        Ok(Self {
            out,
            memo: HashMap::new(),
            open: Vec::new(),
        })
    }

    /// Counts one item of the innermost container (a dict's value, a list's element), closing
    /// and reopening its batch when it is full.
    fn item(&mut self) -> io::Result<()> {
        if let Some(o) = self.open.last_mut() {
            o.items += 1;
            if o.items == BATCH {
                let op = if o.dict { SETITEMS } else { APPENDS };
                o.items = 0;
                self.out.write_all(&[op, MARK])?;
            }
        }
        Ok(())
    }

    /// Opens a dict; its entries follow, each as [`Pickler::key`] then a value.
    pub(crate) fn dict(&mut self) -> io::Result<()> {
        self.out.write_all(&[EMPTY_DICT, MARK])?;
        self.open.push(Open {
            items: 0,
            dict: true,
        });
        Ok(())
    }

    /// Opens a list; its elements follow.
    pub(crate) fn list(&mut self) -> io::Result<()> {
        self.out.write_all(&[EMPTY_LIST, MARK])?;
        self.open.push(Open {
            items: 0,
            dict: false,
        });
        Ok(())
    }

    /// Closes the innermost dict or list (which counts as an item of its own container).
    pub(crate) fn end(&mut self) -> io::Result<()> {
        let o = self
            .open
            .pop()
            .ok_or_else(|| io::Error::other("pickle: end() with no open container"))?;
        self.out
            .write_all(&[if o.dict { SETITEMS } else { APPENDS }])?;
        self.item()
    }

    /// A dict's key (a value must follow).
    pub(crate) fn key(&mut self, k: &str) -> io::Result<()> {
        self.string_raw(k)
    }

    /// A string value.
    pub(crate) fn str(&mut self, s: &str) -> io::Result<()> {
        self.string_raw(s)?;
        self.item()
    }

    fn string_raw(&mut self, s: &str) -> io::Result<()> {
        if let Some(&k) = self.memo.get(s) {
            return match u8::try_from(k) {
                Ok(k) => self.out.write_all(&[BINGET, k]),
                Err(_) => {
                    self.out.write_all(&[LONG_BINGET])?;
                    self.out.write_all(&k.to_le_bytes())
                }
            };
        }
        let len = u32::try_from(s.len())
            .map_err(|_| io::Error::other("pickle: a string of 4 GiB or more"))?;
        self.out.write_all(&[BINUNICODE])?;
        self.out.write_all(&len.to_le_bytes())?;
        self.out.write_all(s.as_bytes())?;
        let Ok(k) = u32::try_from(self.memo.len()) else {
            return Ok(()); // The memo is full: later copies are written out again.
        };
        match u8::try_from(k) {
            Ok(k) => self.out.write_all(&[BINPUT, k])?,
            Err(_) => {
                self.out.write_all(&[LONG_BINPUT])?;
                self.out.write_all(&k.to_le_bytes())?;
            }
        }
        self.memo.insert(s.to_string(), k);
        Ok(())
    }

    /// An int value.
    pub(crate) fn int(&mut self, v: i64) -> io::Result<()> {
        if (0..=0xff).contains(&v) {
            self.out.write_all(&[BININT1, v as u8])?;
        } else if (0..=0xffff).contains(&v) {
            self.out.write_all(&[BININT2])?;
            self.out.write_all(&(v as u16).to_le_bytes())?;
        } else if let Ok(v32) = i32::try_from(v) {
            self.out.write_all(&[BININT])?;
            self.out.write_all(&v32.to_le_bytes())?;
        } else {
            // LONG1: the shortest two's-complement little-endian bytes.
            let bytes = v.to_le_bytes();
            let mut n = 8;
            while n > 1 {
                let top = bytes[n - 1];
                let below = bytes[n - 2];
                let redundant = (top == 0 && below < 0x80) || (top == 0xff && below >= 0x80);
                if !redundant {
                    break;
                }
                n -= 1;
            }
            self.out.write_all(&[LONG1, n as u8])?;
            self.out.write_all(&bytes[..n])?;
        }
        self.item()
    }

    /// An unsigned int value (at most `i64::MAX`; larger ones are clamped).
    pub(crate) fn uint(&mut self, v: u64) -> io::Result<()> {
        self.int(i64::try_from(v).unwrap_or(i64::MAX))
    }

    /// A bool value.
    pub(crate) fn bool(&mut self, v: bool) -> io::Result<()> {
        self.out.write_all(&[if v { NEWTRUE } else { NEWFALSE }])?;
        self.item()
    }

    /// Ends the pickle and returns the writer.
    ///
    /// # Errors
    /// A write error, or containers left open.
    pub(crate) fn finish(mut self) -> io::Result<W> {
        if !self.open.is_empty() {
            return Err(io::Error::other("pickle: containers left open"));
        }
        self.out.write_all(&[STOP])?;
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_use_the_short_opcodes() {
        let mut p = Pickler::new(Vec::new()).unwrap();
        p.list().unwrap();
        for v in [
            0,
            255,
            256,
            65535,
            65536,
            -1,
            1 << 31,
            -(1 << 31) - 1,
            i64::MAX,
        ] {
            p.int(v).unwrap();
        }
        p.str("a").unwrap();
        p.str("a").unwrap();
        p.bool(true).unwrap();
        p.bool(false).unwrap();
        p.end().unwrap();
        let bytes = p.finish().unwrap();
        let mut want = vec![0x80, 3, b']', b'('];
        want.extend([b'K', 0, b'K', 255, b'M', 0, 1, b'M', 255, 255]);
        want.extend([b'J', 0, 0, 1, 0, b'J', 255, 255, 255, 255]);
        // 2^31 needs 5 bytes (a sign byte), -2^31 - 1 too.
        want.extend([0x8a, 5, 0, 0, 0, 0x80, 0]);
        want.extend([0x8a, 5, 0xff, 0xff, 0xff, 0x7f, 0xff]);
        want.extend([0x8a, 8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]);
        want.extend([b'X', 1, 0, 0, 0, b'a', b'q', 0, b'h', 0]);
        want.extend([0x88, 0x89, b'e', b'.']);
        assert_eq!(bytes, want);
    }

    #[test]
    fn unbalanced_containers_are_refused() {
        let mut p = Pickler::new(Vec::new()).unwrap();
        assert!(p.end().is_err());
        p.dict().unwrap();
        assert!(p.finish().is_err());
    }
}
