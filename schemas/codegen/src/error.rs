//! Owns [`CodegenError`], the one error type of the generator.

/// Why a schema could not be turned into Rust code.
#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    /// The schema file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file that failed.
        path: String,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// The document is not well-formed XML.
    #[error("XML: {0}")]
    Xml(#[from] roxmltree::Error),
    /// A required attribute is missing.
    #[error("<{element} name=\"{name}\">: missing attribute `{attribute}`")]
    MissingAttribute {
        /// Tag name of the element.
        element: String,
        /// Its `name` attribute, or empty.
        name: String,
        /// The attribute that is missing.
        attribute: &'static str,
    },
    /// An attribute or text value could not be parsed.
    #[error("`{name}`: invalid value `{value}` for {what}")]
    InvalidValue {
        /// Where the value is: the element, with its enclosing types or messages
        /// (`Message.Group.Field`, `Composite.member`).
        name: String,
        /// What the value should have been.
        what: String,
        /// The offending text.
        value: String,
    },
    /// A `valueRef` does not name a valid value of an enum that fits the constant's type.
    #[error("`{name}`: valueRef `{value_ref}`: {why}")]
    ValueRef {
        /// The element with the `valueRef`, with its enclosing types or messages.
        name: String,
        /// The `valueRef` as written.
        value_ref: String,
        /// What is wrong with it.
        why: String,
    },
    /// A field, group dimension or var-data element refers to a type that is not defined.
    #[error("`{user}` refers to unknown type `{type_name}`")]
    UnknownType {
        /// The element that uses the type.
        user: String,
        /// The missing type name.
        type_name: String,
    },
    /// The schema uses a construct this generator does not implement.
    #[error("`{name}`: unsupported: {what}")]
    Unsupported {
        /// The element that uses it.
        name: String,
        /// What is not supported.
        what: &'static str,
    },
    /// Layout is inconsistent (overlapping offsets, block length too short, …).
    #[error("`{name}`: {what}")]
    Layout {
        /// The element with the bad layout.
        name: String,
        /// What is wrong.
        what: String,
    },
}
