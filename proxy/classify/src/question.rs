//! The final question of a prompt: the last user turn without its few-shot examples and answer
//! format boilerplate.
//!
//! Benchmark harnesses and many applications wrap one question in solved examples ("Q: … A: 3",
//! five times) and format instructions ("Print only a single choice … Answer:"). Read whole, such
//! a prompt looks long and hard whatever the question is: the old complexity model tagged
//! Winogrande 94% `high` with its five examples and 6% without. Features read only what this
//! module keeps, so the same question gets the same tag however it is wrapped (the research, in
//! `docs/benchmarks/classification-research.md`, measured 100% agreement on 1,267 Winogrande
//! questions 5-shot, 0-shot and re-formatted 3-shot).
//!
//! The rules (E1–E7 of the research; `scripts/classify/kclassify.py` is the reference the model
//! was trained with), on lines trimmed of whitespace:
//!
//! - **E1** `\r\n` and `\r` end lines too.
//! - **E2** a line is an *answer cue* when it starts with `A:` (case-sensitive), `answer:`,
//!   `answer :`, `output:`, `solution:`, `label:`, `target:`, `答案:` or `答案：` (ASCII case
//!   folded), or ends with `answer:`. Its content is the rest of the line, or, when that is empty
//!   and the cue is not the last line, the next non-empty line unless that is a cue too. A cue
//!   is *filled* when its content is not empty and not a chain-of-thought trigger ("let's think
//!   step by step"), else *open*.
//! - **E3** when the last non-empty line is an open cue, the question starts after the first blank
//!   line that follows the content of the last filled cue with a blank line before the last line
//!   (solved examples are separated by blank lines; lettered options such as `A: Marina reads a
//!   book.` inside one question are not).
//! - **E4** that open cue is removed (the whole line, or the `answer:` ending it), and so is a
//!   chain-of-thought trigger alone on the last line.
//! - **E5** lines that only say how to format the answer ("print only", "answer with only", …)
//!   are removed.
//! - **E6** a leading `Q:` (case-sensitive), `question:`, `problem:` or `input:` is removed from
//!   the first line, at most twice.
//! - **E7** leading and trailing blank lines are dropped and the lines joined with `\n`; an empty
//!   result falls back to the trimmed input.

/// Line starts that make a line an answer cue, compared with ASCII case folded.
const CUE_PREFIXES: [&str; 8] = [
    "answer:",
    "answer :",
    "output:",
    "solution:",
    "label:",
    "target:",
    "答案:",
    "答案：",
];

/// Chain-of-thought triggers: a cue whose content is one of these is still open.
const COT: [&str; 4] = [
    "let's think step by step",
    "let's think step-by-step",
    "think step by step",
    "let’s think step by step",
];

/// Lines that only tell the model how to format its answer.
const BOILERPLATE: [&str; 13] = [
    "print only",
    "please answer with the letter",
    "answer with the option's letter",
    "answer with only",
    "respond with only",
    "reply with only",
    "output only",
    "return only",
    "only output",
    "choose the correct answer",
    "select the correct answer",
    "the following are multiple choice questions",
    "please choose the correct answer",
];

/// Labels removed from the start of the question, compared with ASCII case folded.
const QUESTION_LABELS: [&str; 3] = ["question:", "problem:", "input:"];

fn starts_with_folded(s: &str, prefix: &str) -> bool {
    s.len() >= prefix.len() && s.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

fn ends_with_folded(s: &str, suffix: &str) -> bool {
    s.len() >= suffix.len()
        && s.as_bytes()[s.len() - suffix.len()..].eq_ignore_ascii_case(suffix.as_bytes())
}

/// How a trimmed line is an answer cue.
enum Cue<'a> {
    /// Not a cue.
    No,
    /// A cue at the line's start, with the rest of the line.
    Start(&'a str),
    /// A line ending in `answer:`.
    End,
}

fn cue(line: &str) -> Cue<'_> {
    if let Some(rest) = line.strip_prefix("A:") {
        return Cue::Start(rest.trim());
    }
    for p in CUE_PREFIXES {
        if starts_with_folded(line, p) {
            return Cue::Start(line[p.len()..].trim());
        }
    }
    if ends_with_folded(line, "answer:") {
        return Cue::End;
    }
    Cue::No
}

fn is_cot(s: &str) -> bool {
    let low = s.trim().to_lowercase();
    let low = low.trim_end_matches('.');
    COT.iter().any(|c| low.starts_with(c))
}

/// Splits on `\n`, `\r\n` and `\r`.
fn lines(text: &str) -> Vec<&str> {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len() / 40 + 1);
    let mut start = 0;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\n' => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            b'\r' => {
                out.push(&text[start..i]);
                if b.get(i + 1) == Some(&b'\n') {
                    i += 1;
                }
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    out.push(&text[start..]);
    out
}

/// An answer cue found on line `line`: whether it is filled, and the line its content is on.
struct Found {
    line: usize,
    filled: bool,
    content_line: usize,
}

/// The final question of `text` (the last user turn), by the rules in the module doc.
pub fn final_question(text: &str) -> String {
    let mut t: Vec<&str> = lines(text).into_iter().map(str::trim).collect();
    let nonempty: Vec<usize> = (0..t.len()).filter(|&i| !t[i].is_empty()).collect();
    let Some(&last) = nonempty.last() else {
        return text.trim().to_string();
    };
    // E2: the answer cues.
    let mut cues = Vec::new();
    for (k, &i) in nonempty.iter().enumerate() {
        let content = match cue(t[i]) {
            Cue::No => continue,
            Cue::Start(rest) => rest,
            Cue::End => "",
        };
        let (mut content, mut content_line) = (content, i);
        if content.is_empty()
            && i != last
            && let Some(&j) = nonempty.get(k + 1)
            && matches!(cue(t[j]), Cue::No)
        {
            (content, content_line) = (t[j], j);
        }
        cues.push(Found {
            line: i,
            filled: !content.is_empty() && !is_cot(content),
            content_line,
        });
    }
    // E3: the few-shot split.
    let last_is_open = cues.last().is_some_and(|c| c.line == last && !c.filled);
    let mut start = 0;
    if last_is_open {
        for c in cues[..cues.len() - 1].iter().rev().filter(|c| c.filled) {
            if let Some(blank) = (c.content_line + 1..last).find(|&k| t[k].is_empty()) {
                start = blank + 1;
                break;
            }
        }
        // E4: the open cue itself.
        t[last] = match cue(t[last]) {
            Cue::End => t[last][..t[last].len() - "answer:".len()].trim_end(),
            _ => "",
        };
    }
    // E4 (a trigger alone on the last line) and E5.
    let mut out: Vec<&str> = (start..t.len())
        .filter(|&i| {
            let l = t[i];
            let boilerplate = BOILERPLATE.iter().any(|b| starts_with_folded(l, b));
            let trigger = i == last && is_cot(l);
            !(boilerplate || trigger)
        })
        .map(|i| t[i])
        .collect();
    // E7 (the ends) before E6, as the reference does.
    while out.first().is_some_and(|l| l.is_empty()) {
        out.remove(0);
    }
    while out.last().is_some_and(|l| l.is_empty()) {
        out.pop();
    }
    // E6: question labels.
    for _ in 0..2 {
        let Some(first) = out.first_mut() else { break };
        if let Some(rest) = first.strip_prefix("Q:") {
            *first = rest.trim();
            continue;
        }
        match QUESTION_LABELS
            .iter()
            .find(|p| starts_with_folded(first, p))
        {
            Some(p) => *first = first[p.len()..].trim(),
            None => break,
        }
    }
    let joined = out.join("\n");
    let q = joined.trim();
    if q.is_empty() {
        text.trim().to_string()
    } else if q.len() == joined.len() {
        joined
    } else {
        q.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One Winogrande question as RouterBench's 5-shot prompt asks it.
    const WINO_5_SHOT: &str = "The following sentences each have a blank to fill.\n\n\
        Sentence: The trophy doesn't fit into the brown suitcase because the _ is too large.\n\
        Option A: trophy\nOption B: suitcase\n\
        Print only a single choice  from \"A\" or \"B\" without explanation. Answer:\nA\n\n\
        Sentence: Sam pulled up a chair to the piano, but the _ was broken, so he had to sing instead.\n\
        Option A: chair\nOption B: piano\n\
        Print only a single choice  from \"A\" or \"B\" without explanation. Answer:\nB\n\n\
        Sentence: Kevin had to use less sunscreen when at the beach than Justin because _ had less melanin.\n\
        Option A: Kevin\nOption B: Justin\n\
        Print only a single choice  from \"A\" or \"B\" without explanation. Answer:\nB\n\n\
        Sentence: Ian volunteered to eat Dennis's menudo after already having a bowl because _ despised eating intestine.\n\
        Option A: Ian\nOption B: Dennis\n\
        Print only a single choice  from \"A\" or \"B\" without explanation. Answer:\nB\n\n\
        Sentence: The woman avoided the hole but easily stepped over the pit, because the _ was very shallow.\n\
        Option A: hole\nOption B: pit\n\
        Print only a single choice  from \"A\" or \"B\" without explanation. Answer:\nB\n\n\
        Sentence: Natalie had better grades than Jennifer, so _ was accepted into the honors program.\n\
        Option A: Natalie\nOption B: Jennifer\n\
        Print only a single choice  from \"A\" or \"B\" without explanation. Answer:";

    const WINO_QUESTION: &str = "Sentence: Natalie had better grades than Jennifer, so _ was \
        accepted into the honors program.\nOption A: Natalie\nOption B: Jennifer";

    #[test]
    fn winogrande_with_and_without_few_shot_examples_is_one_question() {
        assert_eq!(final_question(WINO_5_SHOT), WINO_QUESTION);
        let zero_shot = format!(
            "{WINO_QUESTION}\nPrint only a single choice  from \"A\" or \"B\" without \
             explanation. Answer:"
        );
        assert_eq!(final_question(&zero_shot), WINO_QUESTION);
        // The same question behind examples written as "Question: … / Answer: X".
        let reformatted = "Question: The cup is on the table because _ is flat.\nAnswer: A\n\n\
            Question: Tom thanked Bill because _ helped.\nAnswer: B\n\n\
            Question: Sentence: Natalie had better grades than Jennifer, so _ was accepted into \
            the honors program.\nOption A: Natalie\nOption B: Jennifer\nAnswer:";
        assert_eq!(final_question(reformatted), WINO_QUESTION);
    }

    #[test]
    fn solved_examples_and_a_trailing_trigger_are_dropped() {
        let bbh = "Evaluate the result of a random Boolean expression.\n\n\
            Q: not ( ( not not True ) ) is\nA: False\n\n\
            Q: True and False and not True and True is\nA: False\n\n\
            Q: not ( True ) and ( True ) is\nA:";
        assert_eq!(final_question(bbh), "not ( True ) and ( True ) is");
        // A chain-of-thought trigger as the open cue's content, or alone on the last line.
        let cot = "Q: 2 + 2 is\nA: 4\n\nQ: 3 + 5 is\nA: Let's think step by step.";
        assert_eq!(final_question(cot), "3 + 5 is");
        assert_eq!(
            final_question("How many legs do 3 spiders have?\nLet\u{2019}s think step by step."),
            "How many legs do 3 spiders have?"
        );
    }

    #[test]
    fn a_question_with_lettered_options_keeps_them() {
        let mmlu = "The following are multiple choice questions (with answers) about biology.\n\n\
            Which organelle makes ATP?\nA. Nucleus\nB. Mitochondrion\nC. Ribosome\nD. Golgi\nAnswer:";
        assert_eq!(
            final_question(mmlu),
            "Which organelle makes ATP?\nA. Nucleus\nB. Mitochondrion\nC. Ribosome\nD. Golgi"
        );
        // "A: ..." keys inside one question, with no blank line, are not solved examples.
        let keys = "Which is a sentence?\nA: Marina reads a book.\nB: reads book\nAnswer:";
        assert_eq!(
            final_question(keys),
            "Which is a sentence?\nA: Marina reads a book.\nB: reads book"
        );
    }

    #[test]
    fn plain_prompts_are_kept_trimmed() {
        assert_eq!(final_question("  What is 2+2?  "), "What is 2+2?");
        assert_eq!(final_question("hi"), "hi");
        assert_eq!(final_question("Q: Question: why?"), "why?");
        assert_eq!(
            final_question("line one\r\n  line two\rline three"),
            "line one\nline two\nline three"
        );
        assert_eq!(final_question("   "), "");
        // Only a cue: nothing is left, so the trimmed input is the question.
        assert_eq!(final_question("Answer:"), "Answer:");
        assert_eq!(
            final_question("Write a poem.\nRespond with only the poem."),
            "Write a poem."
        );
    }
}
