"""The stress corpus: text that finds where two tokenizers part ways.

Each entry aims at one rule a tokenizer file must carry over exactly: a
script's letters and marks, the whitespace a pre-tokenizer splits or a
normalizer folds, the digits a regex groups, the literal text of a special
token (which a reader must not match unless the original does), characters no
vocabulary holds (byte fallback or the unknown token), and the composed and
decomposed spellings of one character. `check_identity` encodes every entry
with keras-hub and with each reader of the written files; an entry is never
dropped because some reader fails it: the report names the reader and the text.
"""

# Entries are grouped by what they test; the tuple order is the report order.
_SCRIPTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Café déjà vu: naïve façade, Ærøskøbing, Øresund, straße, İstanbul, ǅemal.",
    "ÉCOLE ÇA VA, ĲSSEL, ẞ and ß, Ǆ, ﬁnancial ﬂow, Ⅻ, ＦＵＬＬ ｗｉｄｔｈ １２３",
    "Привет, мир! Ёжик в тумане. ПРОПИСНЫЕ буквы.",
    "Καλημέρα κόσμε, ΣΊΣΥΦΟΣ, τελικό ς, ΐ.",
    "مرحبا بالعالم، مَرْحَبًا ١٢٣",
    "שלום עולם, שָׁלוֹם",
    "नमस्ते दुनिया, क्षत्रिय १२३",
    "你好，世界！日本語のテキスト、カタカナ。한국어 텍스트",
    "𠀀𠀁𪚥 CJK extension B and 〇〡",
    "สวัสดีชาวโลก ภาษาไทย",
    "Tiếng Việt có dấu: Nguyễn Thị Minh Khai",
)
_EMOJI = (
    "👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇫🇷 1️⃣",
    "😀😃😄😁 many emoji in a row🙂",
)
_COMBINING = (
    "é",  # U+00E9, composed
    "e\u0301",  # the same letter decomposed
    "Å and A\u030a, ñ and n\u0303",
    "a\u0301\u0302\u0303 stacked marks, \u0301 a lone mark",
    "\u1100\u1161\u11a8 Hangul jamo and 각",
)
# Compatibility characters, which NFKC and case folding turn into several
# characters, some of them punctuation or spaces.
_COMPATIBILITY = ("enclosed ⑴ ⒈ ㈱ ①, ligature ﬃ, ellipsis… two dots‥ ¨ ℡ ㍱ ＂quoted＂",)
_WHITESPACE = (
    "",
    " ",
    "   ",
    "\t",
    "\n",
    "\r\n",
    " \t\n ",
    "  leading and trailing  ",
    "inner    runs  of   spaces",
    "tabs\tand\t\tmore\ttabs",
    "line one\nline two\n\n\nline five\r\nend",
    "no-break\u00a0space, thin\u2009space, ideographic\u3000space, em\u2003space",
    "line\u2028separator and next\x85line, vertical\x0btab, form\x0cfeed",
    "zero\u200bwidth, joiner\u200d, soft\xadhyphen, \ufeffbom",
)
_NUMBERS = (
    "0 1 12 123 1234 12345",
    "3.14159 -2.5e10 1,000,000 98765432109876543210",
    "½ ¾ ² ³ ⁴ ₅ ①",
    "2024-01-15T10:30:00Z",
)
_CODE = (
    "https://example.com/path/to?query=1&x=y#fragment",
    "user.name+tag@example.org",
    "def square(x):\n    return x ** 2  # comment\n",
    "if (a != b && c <= d) { return -1; } else { i++; }",
    '<div class="note">Hello</div>',
    '{"key": [1, 2.5, null, true], "k2": "v"}',
    "SELECT * FROM t WHERE id = 42;",
    "I'm, you're, it's, we've, they'll, I'd, don't, Y'ALL'S",
    "!!!???... --- ––— «quotes» „low“ “curly” ‘single’ ¿¡",
)
_SPECIAL_TEXT = (
    "<s> </s> <unk> <pad> <mask>",
    "[CLS] [SEP] [MASK] [UNK] [PAD]",
    "<|endoftext|> <|begin_of_text|> <|end_of_text|> <|eot_id|>",
    "<bos> <eos> <start_of_turn>user",
    "Hello<|endoftext|>world",
    "[CLS]hello[SEP]world[SEP]",
    "<s>text</s>",
    "<0x41> <0xFF>",
    "▁ a literal lower-eighth block ▁▁x",
    "##suffix ## #",
)
_LONG = (
    "a" * 300,
    "pneumonoultramicroscopicsilicovolcanoconiosis",
    "Donaudampfschifffahrtsgesellschaftskapitänsmützenabzeichen",
    "x" * 99 + " " + "y" * 100 + " " + "z" * 101,
    "é" * 60,
    "abc" * 60,
    "word " * 80,
)
_OUT_OF_VOCABULARY = (
    "☃ ⚙ ∮ ℵ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ꙮ ⅋",
    "private \ue000\U000f0000 use",
    "control \x00\x01\x07\x1b\x7f chars",
    "unpaired tone mark \u0e48 and \ufffd replacement",
    "ᚠᛇᚻ runes, ⠓⠑⠇⠇⠕ braille",
)

STRESS_CORPUS: tuple[str, ...] = (
    _SCRIPTS
    + _EMOJI
    + _COMBINING
    + _COMPATIBILITY
    + _WHITESPACE
    + _NUMBERS
    + _CODE
    + _SPECIAL_TEXT
    + _LONG
    + _OUT_OF_VOCABULARY
)
