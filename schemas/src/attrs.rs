//! Canonical op attributes: what a bundle's `Step` carries and what kernels read.

use crate::proto;
use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    Int(i64),
    Float(f64),
    Text(String),
    Ints(Vec<i64>),
    Floats(Vec<f64>),
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AttrError {
    #[error("attribute '{0}' is missing")]
    Missing(String),
    #[error("attribute '{name}' should be {expected}")]
    WrongKind { name: String, expected: &'static str },
    #[error("attribute '{name}' has no value")]
    Empty { name: String },
}

/// A node's attributes, ordered by name so that everything emitted from them is deterministic.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attrs(BTreeMap<String, AttrValue>);

impl Attrs {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn set(&mut self, name: &str, value: AttrValue) -> &mut Self {
        self.0.insert(name.to_string(), value);
        self
    }

    pub fn with(mut self, name: &str, value: AttrValue) -> Self {
        self.set(name, value);
        self
    }

    pub fn remove(&mut self, name: &str) -> Option<AttrValue> {
        self.0.remove(name)
    }

    pub fn get(&self, name: &str) -> Option<&AttrValue> {
        self.0.get(name)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &AttrValue)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn wrong(name: &str, expected: &'static str) -> AttrError {
        AttrError::WrongKind { name: name.to_string(), expected }
    }

    pub fn int(&self, name: &str) -> Result<i64, AttrError> {
        match self.0.get(name) {
            Some(AttrValue::Int(v)) => Ok(*v),
            Some(_) => Err(Self::wrong(name, "an integer")),
            None => Err(AttrError::Missing(name.to_string())),
        }
    }

    pub fn int_or(&self, name: &str, default: i64) -> Result<i64, AttrError> {
        if self.contains(name) { self.int(name) } else { Ok(default) }
    }

    pub fn float(&self, name: &str) -> Result<f32, AttrError> {
        match self.0.get(name) {
            Some(AttrValue::Float(v)) => Ok(*v as f32),
            Some(AttrValue::Int(v)) => Ok(*v as f32),
            Some(_) => Err(Self::wrong(name, "a float")),
            None => Err(AttrError::Missing(name.to_string())),
        }
    }

    pub fn float_or(&self, name: &str, default: f32) -> Result<f32, AttrError> {
        if self.contains(name) { self.float(name) } else { Ok(default) }
    }

    pub fn text(&self, name: &str) -> Result<&str, AttrError> {
        match self.0.get(name) {
            Some(AttrValue::Text(v)) => Ok(v),
            Some(_) => Err(Self::wrong(name, "a string")),
            None => Err(AttrError::Missing(name.to_string())),
        }
    }

    pub fn text_or<'a>(&'a self, name: &str, default: &'a str) -> Result<&'a str, AttrError> {
        if self.contains(name) { self.text(name) } else { Ok(default) }
    }

    pub fn ints(&self, name: &str) -> Result<&[i64], AttrError> {
        match self.0.get(name) {
            Some(AttrValue::Ints(v)) => Ok(v),
            Some(_) => Err(Self::wrong(name, "a list of integers")),
            None => Err(AttrError::Missing(name.to_string())),
        }
    }

    /// The list, or `None` when the attribute is absent.
    pub fn ints_opt(&self, name: &str) -> Result<Option<&[i64]>, AttrError> {
        if self.contains(name) { self.ints(name).map(Some) } else { Ok(None) }
    }

    pub fn floats(&self, name: &str) -> Result<&[f64], AttrError> {
        match self.0.get(name) {
            Some(AttrValue::Floats(v)) => Ok(v),
            Some(_) => Err(Self::wrong(name, "a list of floats")),
            None => Err(AttrError::Missing(name.to_string())),
        }
    }

    pub fn floats_opt(&self, name: &str) -> Result<Option<&[f64]>, AttrError> {
        if self.contains(name) { self.floats(name).map(Some) } else { Ok(None) }
    }

    pub fn to_proto(&self) -> Vec<proto::Attribute> {
        use proto::attribute::Value;
        self.0
            .iter()
            .map(|(name, v)| proto::Attribute {
                name: name.clone(),
                value: Some(match v {
                    AttrValue::Int(i) => Value::Int(*i),
                    AttrValue::Float(f) => Value::Float(*f),
                    AttrValue::Text(s) => Value::Text(s.clone()),
                    AttrValue::Ints(v) => Value::Ints(proto::Ints { values: v.clone() }),
                    AttrValue::Floats(v) => Value::Floats(proto::Floats { values: v.clone() }),
                }),
            })
            .collect()
    }

    pub fn from_proto(attrs: &[proto::Attribute]) -> Result<Self, AttrError> {
        use proto::attribute::Value;
        let mut out = Attrs::new();
        for a in attrs {
            let value = match &a.value {
                Some(Value::Int(i)) => AttrValue::Int(*i),
                Some(Value::Float(f)) => AttrValue::Float(*f),
                Some(Value::Text(s)) => AttrValue::Text(s.clone()),
                Some(Value::Ints(v)) => AttrValue::Ints(v.values.clone()),
                Some(Value::Floats(v)) => AttrValue::Floats(v.values.clone()),
                None => {
                    return Err(AttrError::Empty { name: a.name.clone() });
                }
            };
            out.set(&a.name, value);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proto_round_trip_is_sorted_and_lossless() {
        let attrs = Attrs::new()
            .with("pads", AttrValue::Ints(vec![1, 1, 1, 1]))
            .with("alpha", AttrValue::Float(0.25))
            .with("mode", AttrValue::Text("linear".into()))
            .with("axis", AttrValue::Int(-1));
        let proto = attrs.to_proto();
        let names: Vec<_> = proto.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["alpha", "axis", "mode", "pads"]);
        assert_eq!(Attrs::from_proto(&proto).unwrap(), attrs);
    }

    #[test]
    fn typed_getters_report_the_attribute() {
        let attrs = Attrs::new().with("axis", AttrValue::Text("x".into()));
        assert_eq!(
            attrs.int("axis").unwrap_err().to_string(),
            "attribute 'axis' should be an integer"
        );
        assert_eq!(attrs.int_or("keepdims", 1), Ok(1));
        assert_eq!(attrs.ints("perm").unwrap_err(), AttrError::Missing("perm".into()));
    }
}
