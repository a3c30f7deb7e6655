// A picker of dimension values: a text field with suggestions from the data (a <datalist> of
// the values with the most impressions in the range, under the other filters), and the chosen
// values as chips. Keyboard: type a value (or pick a suggestion with the arrow keys) and press
// Enter; Tab to a chip's × and press Enter or Space to remove it. Values are shown through
// visibleText (invisible characters as ⟨U+XXXX⟩); the values chosen are the data's own.

import { valueOfText, visibleText } from "./visible.js";

let pickers = 0;

export class ValuePicker {
  /**
   * @param container  element to build into
   * @param options    {label, dimension, max, placeholder, suggest(dimension) -> Promise of
   *                   [{value, impressions}], onChange(values)}
   */
  constructor(container, { label, dimension, max, placeholder, suggest, onChange }) {
    pickers += 1;
    const id = `picker-${pickers}`;
    this.dimension = dimension;
    this.max = max;
    this.suggest = suggest;
    this.onChange = onChange;
    this.values = [];
    this.suggestions = new Set();
    this.loaded = false; // suggestions asked for once ...
    this.stale = false; // ... and still for the current range and filters
    this.placeholder = placeholder;

    this.root = document.createElement("div");
    this.root.className = "picker";
    this.root.dataset.dimension = dimension;
    this.label = document.createElement("label");
    this.label.htmlFor = id;
    this.label.textContent = label;
    this.input = document.createElement("input");
    this.input.id = id;
    this.input.type = "text";
    this.input.autocomplete = "off";
    this.input.spellcheck = false;
    this.input.setAttribute("list", `${id}-options`);
    this.input.setAttribute("aria-describedby", `${id}-chips`);
    this.list = document.createElement("datalist");
    this.list.id = `${id}-options`;
    this.chips = document.createElement("ul");
    this.chips.className = "chips";
    this.chips.id = `${id}-chips`;
    this.chips.setAttribute("aria-label", `${label}: chosen values`);
    this.root.append(this.label, this.input, this.list, this.chips);
    container.append(this.root);

    this.input.addEventListener("focus", () => this.loadSuggestions());
    this.input.addEventListener("keydown", (event) => {
      if (event.key !== "Enter") return;
      event.preventDefault();
      this.add(this.typed(this.input.value));
    });
    // Picking a suggestion from the list replaces the field's text in one step.
    this.input.addEventListener("input", (event) => {
      const picked = event.inputType === "insertReplacementText" || !(event instanceof InputEvent);
      if (picked && this.suggestions.has(this.input.value)) this.add(this.input.value);
    });
    this.setValues([]);
  }

  /** Show `values` as chosen (no change event: the caller knows). */
  setValues(values) {
    this.values = [...values];
    this.chips.replaceChildren(
      ...this.values.map((value) => {
        const chip = document.createElement("li");
        chip.className = "chip";
        const text = document.createElement("span");
        text.textContent = visibleText(value);
        const remove = document.createElement("button");
        remove.type = "button";
        remove.textContent = "×";
        remove.setAttribute("aria-label", `Remove ${this.label.textContent} ${visibleText(value)}`);
        remove.addEventListener("click", () => this.remove(value));
        chip.append(text, remove);
        return chip;
      }),
    );
    const full = this.values.length >= this.max;
    this.input.disabled = full;
    this.input.placeholder = full ? `at most ${this.max}` : this.placeholder;
    this.root.classList.toggle("active", this.values.length > 0);
  }

  /**
   * The value typed text stands for: a suggestion exactly as it is (trimming would cut its own
   * spaces), else the text trimmed, with its ⟨U+XXXX⟩ read back.
   */
  typed(text) {
    return this.suggestions.has(text) ? text : valueOfText(text.trim());
  }

  /** Choose `value` (exactly as given). */
  add(value) {
    this.input.value = "";
    if (!value || this.values.includes(value) || this.values.length >= this.max) return;
    this.setValues([...this.values, value]);
    this.onChange(this.values);
    if (!this.input.disabled) this.input.focus();
  }

  remove(value) {
    this.setValues(this.values.filter((v) => v !== value));
    this.onChange(this.values);
    this.input.focus();
  }

  /** Ask for suggestions again the next time the field gets focus (range or filters changed). */
  invalidate() {
    this.stale = true;
  }

  async loadSuggestions() {
    if (this.loaded && !this.stale) return;
    this.loaded = true;
    this.stale = false;
    try {
      const found = await this.suggest(this.dimension);
      this.suggestions = new Set(found.map((s) => s.value));
      this.list.replaceChildren(
        ...found.map(({ value, impressions }) => {
          const option = document.createElement("option");
          option.value = value; // what picking it adds: the value itself
          const count = `${impressions.toLocaleString("en-US")} impressions`;
          const shown = visibleText(value);
          option.label = shown === value ? count : `${shown} · ${count}`;
          return option;
        }),
      );
    } catch {
      this.loaded = false; // the page's refresh reports what is wrong with the API
    }
  }
}
