// Dimension values as the page shows them. A character that displays as nothing or reorders the
// text around it is written as its code point, ⟨U+202E⟩, so that `cmp-001` and `cmp-001\u200b`
// look different and `cmp-\u202egnp.exe` does not pass for `cmp-exe.png`. The event contract
// (events/model.py) refuses these characters, but values stored before it, or made in SQL, may
// hold them. What the page sends to the API is always the value itself, never its shown text.

// The contract's set: controls, format characters, line and paragraph separators, every space
// but the ASCII space, default-ignorable code points, BRAILLE PATTERN BLANK, surrogates,
// noncharacters. And "⟨" itself, so that a shown text stands for exactly one value.
const ESCAPED =
  /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Cs}\p{Default_Ignorable_Code_Point}\p{Noncharacter_Code_Point}\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000\u2800\u27e8]/gu;
const SHOWN = /⟨U\+([0-9A-F]{4,6})⟩/g;

const codePoint = (char) => `⟨U+${char.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}⟩`;

/** `value` as text to show: the characters above as ⟨U+XXXX⟩ (null and undefined as ""). */
export function visibleText(value) {
  if (value === null || value === undefined) return "";
  return String(value).replace(ESCAPED, codePoint);
}

/**
 * The value a shown text stands for: ⟨U+XXXX⟩ back to its character, where visibleText writes
 * that character so (a value copied from a chip or a table cell and typed into a filter).
 */
export function valueOfText(text) {
  return text.replace(SHOWN, (shown, hex) => {
    const code = Number.parseInt(hex, 16);
    if (code > 0x10ffff) return shown;
    const char = String.fromCodePoint(code);
    return char.replace(ESCAPED, codePoint) === shown ? char : shown;
  });
}
