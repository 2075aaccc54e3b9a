//! Reads the configuration document (`document.rs`) out of a parsed JSON value, in the
//! reference's words.
//!
//! Invariant: every error names the path of the value it is about (`rules[1].match.hosts[0]`) and
//! says what is wrong as the reference does ("must be a string", "must be an object", "unknown
//! field", "required", `must be one of "a", "b" (got "x")`); serde's own wording never reaches a
//! user, and no error echoes a value but an enum string (escaped and cut by `quoted`). A JSON
//! `null` is a value like any other, never an absent field. An object's unknown fields are
//! reported before any of its values, and its fields are read in the order the document declares
//! them (not the order of the text or of the map), so a document with several faults always
//! reports the same one first.

use std::fmt;

use serde::de::value::BorrowedStrDeserializer;
use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::error::{field_name, quoted, ConfigError, DOCUMENT};

/// `T` as `value` gives it.
pub fn read<'v, T: Deserialize<'v>>(value: &'v Value) -> Result<T, ConfigError> {
    T::deserialize(Reader {
        value,
        path: Path::Root,
    })
    .map_err(Error::into_config_error)
}

/// Where a value sits in the document: a chain of segments, on the stack while it is read.
#[derive(Clone, Copy)]
enum Path<'a> {
    Root,
    Field(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

/// `rules[1].match.hosts[0]`; a name the user wrote is escaped (`a\nb`).
impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => Ok(()),
            Path::Field(Path::Root, name) => f.write_str(&field_name(name)),
            Path::Field(parent, name) => write!(f, "{parent}.{}", field_name(name)),
            Path::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

/// A reading error, placed on its path on its way out of the value it is about.
#[derive(Debug)]
pub struct Error {
    place: Place,
    reason: String,
}

#[derive(Debug)]
enum Place {
    /// The value being read (a visitor's error: its reader knows the path).
    Here,
    /// A field of the object being read (missing, or unknown).
    Child(String),
    /// Placed.
    At(String),
}

impl Error {
    fn here(reason: String) -> Error {
        Error {
            place: Place::Here,
            reason,
        }
    }

    #[inline(never)]
    fn at(self, path: &Path<'_>) -> Error {
        let place = match self.place {
            Place::Here => Place::At(path.to_string()),
            Place::Child(name) => Place::At(Path::Field(path, &name).to_string()),
            placed @ Place::At(_) => placed,
        };
        Error {
            place,
            reason: self.reason,
        }
    }

    fn into_config_error(self) -> ConfigError {
        let field = match self.place {
            Place::At(field) | Place::Child(field) if !field.is_empty() => field,
            _ => DOCUMENT.to_owned(),
        };
        ConfigError {
            field,
            reason: self.reason,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for Error {}

/// The document types' errors in the reference's words (serde's defaults would say "invalid
/// type: string \"x\", expected u64" and echo the value).
impl de::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Error::here(msg.to_string())
    }

    fn invalid_type(_: de::Unexpected<'_>, expected: &dyn de::Expected) -> Self {
        Error::here(format!("must be {expected}"))
    }

    fn invalid_value(_: de::Unexpected<'_>, expected: &dyn de::Expected) -> Self {
        Error::here(format!("must be {expected}"))
    }

    fn invalid_length(_: usize, expected: &dyn de::Expected) -> Self {
        Error::here(format!("must be {expected}"))
    }

    fn unknown_variant(variant: &str, expected: &'static [&'static str]) -> Self {
        let names: Vec<String> = expected.iter().map(|n| format!("{n:?}")).collect();
        Error::here(format!(
            "must be one of {} (got {})",
            names.join(", "),
            quoted(variant)
        ))
    }

    fn unknown_field(field: &str, _: &'static [&'static str]) -> Self {
        Error {
            place: Place::Child(field.to_owned()),
            reason: "unknown field".to_owned(),
        }
    }

    fn missing_field(field: &'static str) -> Self {
        Error {
            place: Place::Child(field.to_owned()),
            reason: "required".to_owned(),
        }
    }

    fn duplicate_field(field: &'static str) -> Self {
        Error {
            place: Place::Child(field.to_owned()),
            reason: "given twice".to_owned(),
        }
    }
}

/// One value of the document and where it is.
struct Reader<'v, 'p> {
    value: &'v Value,
    path: Path<'p>,
}

impl<'v> Reader<'v, '_> {
    /// The object a struct with `fields` is read from, unless it is not an object or has a field
    /// the struct does not (not generic: one copy in the wasm for every struct).
    #[inline(never)]
    fn object(&self, fields: &[&str]) -> Result<&'v Map<String, Value>, Error> {
        let Value::Object(map) = self.value else {
            return Err(self.wrong("an object"));
        };
        match map.keys().find(|k| !fields.contains(&k.as_str())) {
            Some(unknown) => Err(Error {
                place: Place::At(Path::Field(&self.path, unknown).to_string()),
                reason: "unknown field".to_owned(),
            }),
            None => Ok(map),
        }
    }

    /// The value is not of the type its field takes.
    #[inline(never)]
    fn wrong(&self, what: &str) -> Error {
        Error {
            place: Place::At(self.path.to_string()),
            reason: format!("must be {what}"),
        }
    }
}

impl<'de> Deserializer<'de> for Reader<'de, '_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let path = self.path;
        let read = match self.value {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Number(n) => match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => visitor.visit_u64(u),
                (None, Some(i)) => visitor.visit_i64(i),
                (None, None) => visitor.visit_f64(n.as_f64().unwrap_or(f64::NAN)),
            },
            Value::String(s) => visitor.visit_borrowed_str(s),
            // No type of the document reads a list or an object but as a list or a struct: any
            // other is told what it expects (an `Int`: "must be an integer >= 1").
            Value::Array(_) => Err(de::Error::invalid_type(de::Unexpected::Seq, &visitor)),
            Value::Object(_) => Err(de::Error::invalid_type(de::Unexpected::Map, &visitor)),
        };
        read.map_err(|e: Error| e.at(&path))
    }

    /// A field that is there is never `None`, even when it is `null`: only a field left out
    /// takes its default.
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_some(self)
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            Value::Bool(b) => visitor.visit_bool(*b).map_err(|e: Error| e.at(&self.path)),
            _ => Err(self.wrong("a boolean")),
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            Value::String(s) => visitor
                .visit_borrowed_str(s)
                .map_err(|e: Error| e.at(&self.path)),
            _ => Err(self.wrong("a string")),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let path = self.path;
        match self.value {
            Value::Array(items) => visitor
                .visit_seq(Items {
                    items: items.iter().enumerate(),
                    path: &path,
                })
                .map_err(|e| e.at(&path)),
            _ => Err(self.wrong("an array")),
        }
    }

    /// An object whose keys the user names (`tiers.limits`), each value at `path.<key>`, in the
    /// object's key order (sorted: the order does not depend on the text).
    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let path = self.path;
        match self.value {
            Value::Object(map) => visitor
                .visit_map(Entries {
                    entries: map.iter(),
                    path: &path,
                    next: None,
                })
                .map_err(|e| e.at(&path)),
            _ => Err(self.wrong("an object")),
        }
    }

    /// An object whose keys are all `fields`, read in their order.
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        let path = self.path;
        let map = self.object(fields)?;
        visitor
            .visit_map(Fields {
                map,
                names: fields.iter(),
                path: &path,
                next: None,
            })
            .map_err(|e| e.at(&path))
    }

    /// One of the enum's names (the document's enums are names only).
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.value {
            Value::String(s) => visitor
                .visit_enum(BorrowedStrDeserializer::<Error>::new(s))
                .map_err(|e| e.at(&self.path)),
            _ => Err(self.wrong("a string")),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char bytes byte_buf unit unit_struct
        tuple tuple_struct
    }
}

/// An array's items, each at `path[i]`.
struct Items<'v, 'p> {
    items: std::iter::Enumerate<std::slice::Iter<'v, Value>>,
    path: &'p Path<'p>,
}

impl<'de> SeqAccess<'de> for Items<'de, '_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        let Some((i, value)) = self.items.next() else {
            return Ok(None);
        };
        seed.deserialize(Reader {
            value,
            path: Path::Index(self.path, i),
        })
        .map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len())
    }
}

/// A struct's fields that the object has, in the struct's order, each at `path.name`.
struct Fields<'v, 'p> {
    map: &'v Map<String, Value>,
    names: std::slice::Iter<'static, &'static str>,
    path: &'p Path<'p>,
    next: Option<(&'static str, &'v Value)>,
}

impl<'de> MapAccess<'de> for Fields<'de, '_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        for &name in self.names.by_ref() {
            if let Some(value) = self.map.get(name) {
                self.next = Some((name, value));
                return seed
                    .deserialize(BorrowedStrDeserializer::new(name))
                    .map(Some);
            }
        }
        Ok(None)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let Some((name, value)) = self.next.take() else {
            return Err(Error::here("a value without its field".to_owned()));
        };
        seed.deserialize(Reader {
            value,
            path: Path::Field(self.path, name),
        })
    }
}

/// An object's entries, each value at `path.<key>` (a map whose keys the user names).
struct Entries<'v, 'p> {
    entries: serde_json::map::Iter<'v>,
    path: &'p Path<'p>,
    next: Option<(&'v str, &'v Value)>,
}

impl<'de> MapAccess<'de> for Entries<'de, '_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some((key, value)) = self.entries.next() else {
            return Ok(None);
        };
        self.next = Some((key, value));
        seed.deserialize(BorrowedStrDeserializer::new(key))
            .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let Some((key, value)) = self.next.take() else {
            return Err(Error::here("a value without its key".to_owned()));
        };
        seed.deserialize(Reader {
            value,
            path: Path::Field(self.path, key),
        })
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}

/// The fields a derived struct declares, in order: what its `deserialize_struct` is given.
pub fn fields_of<T: Deserialize<'static>>() -> &'static [&'static str] {
    match T::deserialize(FieldNames) {
        Err(Declared(fields)) => fields,
        Ok(_) => &[],
    }
}

/// A deserializer that only asks a struct for its field names.
struct FieldNames;

/// The field names a struct declared (the only "error" `FieldNames` gives).
#[derive(Debug)]
struct Declared(&'static [&'static str]);

impl fmt::Display for Declared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl std::error::Error for Declared {}

impl de::Error for Declared {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Declared(&[])
    }
}

impl<'de> Deserializer<'de> for FieldNames {
    type Error = Declared;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Declared> {
        Err(Declared(&[]))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Declared> {
        Err(Declared(fields))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}
