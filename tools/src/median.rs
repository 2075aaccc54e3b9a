//! Medians: every figure the tools print is a median over rounds, so that one slow round on a
//! shared machine moves none of them.

/// The median of `values` (sorted in place); `None` for none.
pub fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let mid = n / 2;
    let upper = *values.get(mid)?;
    Some(if n % 2 == 1 {
        upper
    } else {
        (*values.get(mid - 1)? + upper) / 2.0
    })
}

/// The (lower quartile, upper quartile) of sorted `values`: the values at a quarter and three
/// quarters of the way along; `None` for none.
pub fn quartiles(sorted: &[f64]) -> Option<(f64, f64)> {
    let n = sorted.len();
    Some((*sorted.get(n / 4)?, *sorted.get((3 * n) / 4)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_quartiles() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(quartiles(&[]), None);
        assert_eq!(quartiles(&[1.0, 2.0, 3.0, 4.0]), Some((2.0, 4.0)));
    }
}
