//! Async invocation ids and answers: ids are 128 random bits (a CSPRNG), so one caller cannot
//! guess another's; an answer read off the wire becomes a typed outcome. The records
//! themselves live in [`crate::store`], driven by [`crate::delivery`].

use hearth_api::{AsyncOutcome, ErrorBody, ErrorCode, InvokeAnswer};

/// 128 bits from the thread's CSPRNG (ChaCha, seeded from the OS), as 32 hex digits.
pub fn new_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// The typed outcome of an answer read off the wire; a body that is neither a success nor an
/// error answer is kept as an internal error that says so.
pub fn outcome_of(http_status: u16, body: &[u8]) -> AsyncOutcome {
    if (200..300).contains(&http_status) {
        if let Some(a) = InvokeAnswer::parse(body) {
            return AsyncOutcome::Succeeded(a);
        }
    } else if let Some(error) = ErrorBody::parse(body) {
        return AsyncOutcome::Failed { http_status, error };
    }
    AsyncOutcome::Failed {
        http_status: 502,
        error: ErrorBody::new(
            ErrorCode::Internal,
            format!("the answer (HTTP {http_status}) was not a Hearth answer"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_128_random_bits() {
        let (a, b) = (new_id(), new_id());
        for id in [&a, &b] {
            assert_eq!(id.len(), 32, "{id}");
            assert!(id.bytes().all(|c| c.is_ascii_hexdigit()), "{id}");
        }
        // No shared prefix beyond chance (a per-process prefix plus a counter would share 8+).
        let common = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
        assert!(common < 8, "{a} {b}");
        let (x, y) = (
            u128::from_str_radix(&a, 16).unwrap(),
            u128::from_str_radix(&b, 16).unwrap(),
        );
        assert!(x.abs_diff(y) > 1 << 64, "{a} {b}");
    }

    #[test]
    fn answers_become_typed_outcomes() {
        let ok = outcome_of(
            200,
            br#"{"result":{"x":1},"cold":true,"worker":"w","timing":{"queue":0,"init":0,"exec":1,"overhead":1,"e2e":2}}"#,
        );
        assert!(matches!(ok, AsyncOutcome::Succeeded(_)));
        let err = outcome_of(502, br#"{"error":{"code":"handler_error","message":"m"}}"#);
        assert!(matches!(
            err,
            AsyncOutcome::Failed {
                http_status: 502,
                ..
            }
        ));
        match outcome_of(200, b"garbage") {
            AsyncOutcome::Failed { error, .. } => assert_eq!(error.error.code, ErrorCode::Internal),
            other => panic!("{other:?}"),
        }
    }
}
