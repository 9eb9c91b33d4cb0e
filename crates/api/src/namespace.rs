//! Namespaces: every function belongs to one, and one tenant's names never meet another's.
//!
//! Inside Hearth a function is known by its *key*: its name in the `default` namespace, and
//! `namespace.name` in any other. Neither part may contain a `.`, so the key is unambiguous, and
//! it is a valid file name, container id and metric label; the core, the registry and the
//! balancer keep working with one string per function, and a deployment with a single tenant
//! sees exactly the names it registered.

/// The namespace of the operator's own functions, and of every function when authentication
/// is off.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Longest namespace name.
pub const MAX_NAMESPACE_LEN: usize = 32;

/// 1–32 characters of `[a-z0-9-]`, starting with a letter or digit.
pub fn valid_namespace(ns: &str) -> bool {
    let b = ns.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_NAMESPACE_LEN
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// The key of function `name` in namespace `ns`.
pub fn function_key(ns: &str, name: &str) -> String {
    if ns == DEFAULT_NAMESPACE {
        name.to_string()
    } else {
        format!("{ns}.{name}")
    }
}

/// A key's namespace and name.
pub fn split_key(key: &str) -> (&str, &str) {
    match key.split_once('.') {
        Some((ns, name)) => (ns, name),
        None => (DEFAULT_NAMESPACE, key),
    }
}

/// The namespace a key belongs to.
pub fn namespace_of(key: &str) -> &str {
    split_key(key).0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_the_default_namespace_keeps_plain_names() {
        assert_eq!(function_key("default", "hello"), "hello");
        assert_eq!(function_key("team-a", "hello"), "team-a.hello");
        assert_eq!(split_key("team-a.hello"), ("team-a", "hello"));
        assert_eq!(split_key("hello"), ("default", "hello"));
        assert_eq!(namespace_of("hello"), "default");
    }

    #[test]
    fn namespace_names_are_checked() {
        assert!(valid_namespace("team-a"));
        assert!(valid_namespace("a1"));
        for bad in ["", "-a", "Team", "a.b", "a/b", &"x".repeat(33)] {
            assert!(!valid_namespace(bad), "{bad:?}");
        }
    }
}
