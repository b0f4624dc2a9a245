//! A reviewer's verdict on an attempt's sealed work (ADR-038): approve, or changes requested
//! with comments, or no usable verdict at all. The comments are a model's words, so every
//! one is escaped (terminal escapes dropped, control and invisible characters shown as
//! `\u{..}`) and bounded in number and bytes when the value is made *and* when it is
//! deserialized (a journal is read back through the same bounds).

use serde::{Deserialize, Serialize};

use super::retry::clean_head;

/// The most comments a verdict keeps (then how many more there were is dropped: a review
/// with more than this many points asks for a different attempt anyway).
pub const MAX_COMMENTS: usize = 20;
/// Bytes kept of each comment (its start).
pub const MAX_COMMENT_BYTES: usize = 1024;
/// Bytes kept of why a review gave no verdict.
pub const MAX_REVIEW_REASON_BYTES: usize = 1024;

/// What the reviewer said of one attempt's work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum ReviewVerdict {
    /// The work may enter the merge queue; comments, if any, are notes for the record.
    Approve { comments: ReviewComments },
    /// The attempt fails; the next one is told the comments.
    ChangesRequested { comments: ReviewComments },
    /// No usable verdict (the model failed, or answered nothing usable within the call
    /// cap): the attempt fails, nothing unreviewed lands.
    Failed {
        #[serde(deserialize_with = "bounded_reason")]
        reason: String,
    },
}

impl ReviewVerdict {
    pub fn failed(reason: &str) -> Self {
        ReviewVerdict::Failed {
            reason: clean_head(reason, false, MAX_REVIEW_REASON_BYTES),
        }
    }

    /// The verdict's name as `tail` and `status` say it.
    pub fn words(&self) -> &'static str {
        self.mark().words()
    }

    pub fn comments(&self) -> &[String] {
        match self {
            ReviewVerdict::Approve { comments } | ReviewVerdict::ChangesRequested { comments } => {
                comments.as_slice()
            }
            ReviewVerdict::Failed { .. } => &[],
        }
    }
}

fn bounded_reason<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let raw = String::deserialize(d)?;
    Ok(clean_head(&raw, false, MAX_REVIEW_REASON_BYTES))
}

/// The last verdict on a task, as its status line shows it (the comments are in the
/// journal's `ReviewVerdict` event).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastReview {
    pub attempt: u32,
    pub mark: ReviewMark,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReviewMark {
    Approved,
    ChangesRequested,
    NoVerdict,
}

impl ReviewMark {
    pub fn words(self) -> &'static str {
        match self {
            ReviewMark::Approved => "approved",
            ReviewMark::ChangesRequested => "changes requested",
            ReviewMark::NoVerdict => "no verdict",
        }
    }
}

impl ReviewVerdict {
    pub fn mark(&self) -> ReviewMark {
        match self {
            ReviewVerdict::Approve { .. } => ReviewMark::Approved,
            ReviewVerdict::ChangesRequested { .. } => ReviewMark::ChangesRequested,
            ReviewVerdict::Failed { .. } => ReviewMark::NoVerdict,
        }
    }
}

/// A reviewer's comments: at most [`MAX_COMMENTS`], each escaped, at most
/// [`MAX_COMMENT_BYTES`] and not blank.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Vec<String>", into = "Vec<String>")]
pub struct ReviewComments(Vec<String>);

impl From<Vec<String>> for ReviewComments {
    fn from(raw: Vec<String>) -> Self {
        ReviewComments::new(raw.iter().map(String::as_str))
    }
}

impl From<ReviewComments> for Vec<String> {
    fn from(comments: ReviewComments) -> Self {
        comments.0
    }
}

impl ReviewComments {
    pub fn new<'a>(raw: impl IntoIterator<Item = &'a str>) -> Self {
        ReviewComments(
            raw.into_iter()
                .filter(|c| !c.trim().is_empty())
                .take(MAX_COMMENTS)
                .map(|c| clean_head(c.trim(), true, MAX_COMMENT_BYTES))
                .collect(),
        )
    }

    pub fn as_slice(&self) -> &[String] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Keeps whole comments from the first while their bytes together stay within `max`;
    /// the first is cut to `max` if it alone is longer. Returns whether any were dropped.
    pub fn keep_bytes(&mut self, max: usize) -> bool {
        let mut used = 0usize;
        let mut kept = Vec::new();
        for (i, comment) in self.0.iter().enumerate() {
            let next = used.saturating_add(comment.len());
            if next <= max {
                kept.push(comment.clone());
                used = next;
            } else if i == 0 {
                kept.push(clean_head(comment, true, max));
                break;
            } else {
                break;
            }
        }
        let dropped = kept.len() < self.0.len() || kept.first() != self.0.first();
        self.0 = kept;
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_are_escaped_bounded_and_blank_ones_dropped() {
        let mut raw: Vec<String> = vec![
            "  ".into(),
            "\u{1b}]0;pwned\u{7}use a \u{202e}map".into(),
            "x".repeat(100_000),
        ];
        raw.extend((0..50).map(|i| format!("c{i}")));
        let comments = ReviewComments::from(raw);
        assert_eq!(comments.as_slice().len(), MAX_COMMENTS);
        assert_eq!(comments.as_slice()[0], "use a \\u{202e}map");
        assert!(comments.as_slice()[1].len() <= MAX_COMMENT_BYTES);
        assert!(comments.as_slice()[1].ends_with('…'));
    }

    #[test]
    fn a_deserialized_verdict_is_bounded_too_and_round_trips() {
        let json = serde_json::json!({
            "verdict": "changes_requested",
            "comments": ["\u{1b}[31mred\u{1b}[0m", "y".repeat(10_000)],
        });
        let v: ReviewVerdict = serde_json::from_value(json).unwrap();
        assert_eq!(v.comments()[0], "red");
        assert!(v.comments()[1].len() <= MAX_COMMENT_BYTES);
        let again: ReviewVerdict =
            serde_json::from_str(&serde_json::to_string(&v).unwrap()).unwrap();
        assert_eq!(again, v);
        let failed: ReviewVerdict = serde_json::from_value(serde_json::json!({
            "verdict": "failed", "reason": format!("\n{}", "r".repeat(10_000)),
        }))
        .unwrap();
        let ReviewVerdict::Failed { reason } = failed else {
            panic!()
        };
        assert!(reason.starts_with("\\u{a}") && reason.len() <= MAX_REVIEW_REASON_BYTES);
    }

    #[test]
    fn keeping_bytes_keeps_whole_comments_from_the_first() {
        let mut c = ReviewComments::new(["aaaa", "bbbb", "cccc"]);
        assert!(c.keep_bytes(9));
        assert_eq!(c.as_slice(), ["aaaa", "bbbb"]);
        let mut long = ReviewComments::new(["abcdefghij"]);
        assert!(long.keep_bytes(6));
        assert!(long.as_slice()[0].len() <= 6 && long.as_slice()[0].ends_with('…'));
        let mut fits = ReviewComments::new(["a", "b"]);
        assert!(!fits.keep_bytes(100));
    }
}
