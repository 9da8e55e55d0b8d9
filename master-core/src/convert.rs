//! msgpack values (what minions send) to and from JSON (job cache, CLI output).
//!
//! Byte strings that are not UTF-8 become lossy text; ext types become their text form.

use saltgate_wire::envelope::{self, SaltExt, Value};
use serde_json::Value as Json;

pub fn to_json(v: &Value) -> Json {
    match v {
        Value::Nil => Json::Null,
        Value::Boolean(b) => Json::Bool(*b),
        Value::Integer(i) => i
            .as_i64()
            .map(Json::from)
            .or_else(|| i.as_u64().map(Json::from))
            .unwrap_or(Json::Null),
        Value::F32(f) => serde_json::Number::from_f64(f64::from(*f))
            .map(Json::Number)
            .unwrap_or(Json::Null),
        Value::F64(f) => serde_json::Number::from_f64(*f)
            .map(Json::Number)
            .unwrap_or(Json::Null),
        Value::String(_) | Value::Binary(_) => Json::String(
            String::from_utf8_lossy(envelope::as_bytes(v).unwrap_or_default()).into_owned(),
        ),
        Value::Array(a) => Json::Array(a.iter().map(to_json).collect()),
        Value::Map(m) => Json::Object(
            m.iter()
                .map(|(k, v)| {
                    let key = match envelope::as_bytes(k) {
                        Some(b) => String::from_utf8_lossy(b).into_owned(),
                        None => to_json(k).to_string(),
                    };
                    (key, to_json(v))
                })
                .collect(),
        ),
        Value::Ext(..) => match SaltExt::from_value(v) {
            Some(SaltExt::Datetime(s)) => Json::String(s),
            Some(SaltExt::Constant { name, .. }) => Json::String(name),
            None => Json::Null,
        },
    }
}

pub fn from_json(j: &Json) -> Value {
    match j {
        Json::Null => Value::Nil,
        Json::Bool(b) => Value::Boolean(*b),
        Json::Number(n) => n
            .as_i64()
            .map(Value::from)
            .or_else(|| n.as_u64().map(Value::from))
            .or_else(|| n.as_f64().map(Value::F64))
            .unwrap_or(Value::Nil),
        Json::String(s) => envelope::text(s),
        Json::Array(a) => Value::Array(a.iter().map(from_json).collect()),
        Json::Object(o) => Value::Map(
            o.iter()
                .map(|(k, v)| (envelope::text(k), from_json(v)))
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_plain_data() {
        let j: Json = serde_json::json!({"a": [1, -2, true, null, "x", {"b": 1.5}]});
        assert_eq!(to_json(&from_json(&j)), j);
        assert_eq!(
            to_json(&Value::Binary(vec![0xff])),
            Json::String("\u{fffd}".into())
        );
    }
}
