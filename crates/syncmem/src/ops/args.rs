//! Argument parsing and arity checks for operator builders. Every error names the operator.

use serde_json::Value;

use super::OperatorDef;
use crate::error::{Error, Result};

/// The checked view of a def's arguments, for operator builders (the built-in ones and the
/// user's, see [`super::register_operator`]): arity, known argument names, typed values.
/// Every error is an [`Error::InvalidState`] naming the operator.
pub struct Args<'a> {
    def: &'a OperatorDef,
}

impl<'a> Args<'a> {
    /// Checks the arity (`(min, max)` inputs and outputs), that every argument is one of
    /// `known`, and that no blob name is empty.
    ///
    /// # Errors
    /// [`Error::InvalidState`] naming the operator and what is wrong.
    pub fn check(
        def: &'a OperatorDef,
        inputs: (usize, usize),
        outputs: (usize, usize),
        known: &[&str],
    ) -> Result<Self> {
        let count = |what: &str, n: usize, (lo, hi): (usize, usize)| -> Result<()> {
            if (lo..=hi).contains(&n) {
                return Ok(());
            }
            let want = if lo == hi {
                format!("{lo}")
            } else {
                format!("{lo} to {hi}")
            };
            Err(invalid_def(def, format!("takes {want} {what}, got {n}")))
        };
        count("input(s)", def.inputs.len(), inputs)?;
        count("output(s)", def.outputs.len(), outputs)?;
        for key in def.args.keys() {
            if !known.contains(&key.as_str()) {
                let known = if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                };
                return Err(invalid_def(
                    def,
                    format!("unknown argument {key:?} (known arguments: {known})"),
                ));
            }
        }
        for (i, name) in def.inputs.iter().chain(&def.outputs).enumerate() {
            if name.is_empty() {
                return Err(invalid_def(def, format!("blob name #{i} is empty")));
            }
        }
        Ok(Self { def })
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.def.args.get(key)
    }

    fn wrong(&self, key: &str, want: &str, v: &Value) -> Error {
        invalid_def(
            self.def,
            format!("argument {key:?} must be {want}, got {v}"),
        )
    }

    /// A finite number, or `default` when absent.
    ///
    /// # Errors
    /// [`Error::InvalidState`] when the argument is not a finite number.
    pub fn f32_or(&self, key: &str, default: f32) -> Result<f32> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && (x as f32).is_finite() => Ok(x as f32),
                _ => Err(self.wrong(key, "a finite number", v)),
            },
        }
    }

    /// A finite number that must be present.
    ///
    /// # Errors
    /// [`Error::InvalidState`] when the argument is absent or not a finite number.
    pub fn f32_required(&self, key: &str) -> Result<f32> {
        if self.get(key).is_none() {
            return Err(invalid_def(
                self.def,
                format!("argument {key:?} is required"),
            ));
        }
        self.f32_or(key, 0.0)
    }

    /// An integer, or `default` when absent.
    ///
    /// # Errors
    /// [`Error::InvalidState`] when the argument is not an integer.
    pub fn i64_or(&self, key: &str, default: i64) -> Result<i64> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_i64().ok_or_else(|| self.wrong(key, "an integer", v)),
        }
    }

    /// A string, or `default` when absent.
    ///
    /// # Errors
    /// [`Error::InvalidState`] when the argument is not a string.
    pub fn str_or(&self, key: &str, default: &'a str) -> Result<&'a str> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_str().ok_or_else(|| self.wrong(key, "a string", v)),
        }
    }

    /// A list of non-negative integers (a shape), when present.
    ///
    /// # Errors
    /// [`Error::InvalidState`] when the argument is not such a list.
    pub fn dims(&self, key: &str) -> Result<Option<Vec<usize>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let want = "a list of non-negative integers";
        let list = v.as_array().ok_or_else(|| self.wrong(key, want, v))?;
        list.iter()
            .map(|d| {
                d.as_u64()
                    .and_then(|d| usize::try_from(d).ok())
                    .ok_or_else(|| self.wrong(key, want, v))
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

/// The error for a def that cannot be built (a bad argument value, a bad combination of
/// arguments), naming the operator: what an operator's builder returns.
pub fn invalid_def(def: &OperatorDef, reason: String) -> Error {
    Error::InvalidState {
        op: "create_operator",
        buffer: format!("operator {}", def.label()),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arity_and_unknown_arguments_are_errors_naming_the_operator() {
        let def = OperatorDef::new("Relu", &["x", "y"], &["z"]).named("r1");
        let e = Args::check(&def, (1, 1), (1, 1), &[]).err().unwrap();
        let s = e.to_string();
        assert!(
            s.contains("Relu \"r1\"") && s.contains("takes 1 input"),
            "{s}"
        );

        let def = OperatorDef::new("SGD", &["w", "g"], &["w"]).arg("learning_rate", 0.1);
        let s = Args::check(&def, (2, 2), (0, 1), &["lr"])
            .err()
            .unwrap()
            .to_string();
        assert!(s.contains("learning_rate") && s.contains("lr"), "{s}");
    }

    #[test]
    fn typed_arguments() {
        let def = OperatorDef::new("X", &[], &["y"])
            .arg("shape", vec![2, 3])
            .arg("value", 1.5)
            .arg("bad", "text")
            .arg("neg", vec![-1]);
        let a = Args::check(&def, (0, 0), (1, 1), &["shape", "value", "bad", "neg"]).unwrap();
        assert_eq!(a.dims("shape").unwrap(), Some(vec![2, 3]));
        assert_eq!(a.dims("absent").unwrap(), None);
        assert!(a.dims("neg").is_err());
        assert_eq!(a.f32_or("value", 0.0).unwrap(), 1.5);
        assert!(a.f32_or("bad", 0.0).is_err());
        assert!(a.f32_required("absent").is_err());
        assert_eq!(a.i64_or("absent", 4).unwrap(), 4);
        assert_eq!(a.str_or("bad", "").unwrap(), "text");
    }
}
