//! Integers as decimal text without `core::fmt`, for what goes out on every request or call (the
//! RateLimit headers, the Webdis and RESP commands): the formatting machinery costs more in wasm
//! than the rest of the local path.

/// Appends `n` in decimal. (Digit by digit: UTF-8 validation of the digits would cost more in
/// wasm than writing them.)
pub fn push(out: &mut String, n: u64) {
    let mut digits = [0u8; 20];
    for &d in digits_of(&mut digits, n) {
        out.push(char::from(d));
    }
}

/// Appends `n` in decimal, as bytes.
pub fn push_bytes(out: &mut Vec<u8>, n: u64) {
    let mut digits = [0u8; 20];
    out.extend_from_slice(digits_of(&mut digits, n));
}

/// Appends `n` in decimal, as bytes, with a leading `-` when negative.
pub fn push_signed_bytes(out: &mut Vec<u8>, n: i64) {
    if n < 0 {
        out.push(b'-');
    }
    push_bytes(out, n.unsigned_abs());
}

/// `n` in decimal, written into `buf`: for an argument that goes out by itself, with no buffer
/// to append to.
pub fn digits(buf: &mut [u8; 21], n: u64) -> &[u8] {
    let (_, tail) = buf.split_at_mut(1);
    match <&mut [u8; 20]>::try_from(tail) {
        Ok(tail) => digits_of(tail, n),
        Err(_) => &[],
    }
}

/// `n` in decimal with a leading `-` when negative, written into `buf`.
pub fn signed_digits(buf: &mut [u8; 21], n: i64) -> &[u8] {
    let len = digits(buf, n.unsigned_abs()).len();
    let start = buf.len().saturating_sub(len + usize::from(n < 0));
    if n < 0 {
        if let Some(sign) = buf.get_mut(start) {
            *sign = b'-';
        }
    }
    buf.get(start..).unwrap_or_default()
}

/// `n`'s decimal digits, written at the end of `digits`.
fn digits_of(digits: &mut [u8; 20], mut n: u64) -> &[u8] {
    let mut start = digits.len();
    loop {
        start -= 1;
        if let Some(d) = digits.get_mut(start) {
            *d = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || start == 0 {
            break;
        }
    }
    digits.get(start..).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_text_as_display() {
        for n in [0, 7, 10, 99, 1000, 123_456_789, u64::MAX] {
            let mut s = String::from("x");
            push(&mut s, n);
            assert_eq!(s, format!("x{n}"));
            let mut b = b"x".to_vec();
            push_bytes(&mut b, n);
            assert_eq!(b, format!("x{n}").into_bytes());
            let mut buf = [b'x'; 21];
            assert_eq!(digits(&mut buf, n), format!("{n}").as_bytes());
        }
        for n in [0, -1, 5, -3_000, i64::MIN, i64::MAX] {
            let mut buf = [b'x'; 21];
            assert_eq!(signed_digits(&mut buf, n), format!("{n}").as_bytes());
            let mut b = Vec::new();
            push_signed_bytes(&mut b, n);
            assert_eq!(b, n.to_string().into_bytes());
        }
    }
}
