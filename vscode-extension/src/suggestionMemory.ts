// The suggestions the server answered, remembered by the document text around them, so that
// typing through one (the user types its first characters) or an undo/redo back to a known state
// is answered at once, without asking the server. The item keeps the server's accept command,
// with the characters typed through added to its second argument, so that the server counts
// shows and accepts against the suggestion it made. No `vscode` import.

export interface SuggestionCommand {
  readonly title: string;
  readonly command: string;
  /** [suggestion id, code units typed through] (see the server's results.py). */
  readonly arguments?: unknown[];
}

export interface RememberedItem {
  readonly insertText: string;
  readonly command: SuggestionCommand | undefined;
}

interface Entry {
  readonly uri: string;
  readonly text: string;
  readonly offset: number;
  readonly item: RememberedItem;
}

const KEPT = 16;

export class SuggestionMemory {
  private entries: Entry[] = []; // oldest first

  /** Keep the first item the server answered at `offset` in `text`. */
  remember(uri: string, text: string, offset: number, item: RememberedItem): void {
    if (item.insertText === '') {
      return;
    }
    this.entries = this.entries.filter((entry) => !(entry.uri === uri && entry.text === text && entry.offset === offset));
    this.entries.push({ uri, text, offset, item });
    if (this.entries.length > KEPT) {
      this.entries.shift();
    }
  }

  /**
   * The rest of a remembered suggestion when the document is a remembered state with the
   * suggestion's first characters typed at its cursor (none typed: the same state).
   *   remembered 'def f():|' -> '\n    pass'; now 'def f():\n |' -> '   pass'
   */
  answer(uri: string, text: string, offset: number): RememberedItem | undefined {
    for (let index = this.entries.length - 1; index >= 0; index--) {
      const entry = this.entries[index];
      const typedLength = offset - entry.offset;
      if (entry.uri !== uri || typedLength < 0 || text.length - entry.text.length !== typedLength) {
        continue;
      }
      const typed = text.slice(entry.offset, offset);
      const { insertText, command } = entry.item;
      if (
        typedLength >= insertText.length ||
        !insertText.startsWith(typed) ||
        text.slice(0, entry.offset) !== entry.text.slice(0, entry.offset) ||
        text.slice(offset) !== entry.text.slice(entry.offset)
      ) {
        continue;
      }
      return { insertText: insertText.slice(typedLength), command: typedThrough(command, typedLength) };
    }
    return undefined;
  }

  forget(uri: string): void {
    this.entries = this.entries.filter((entry) => entry.uri !== uri);
  }
}

function typedThrough(command: SuggestionCommand | undefined, typed: number): SuggestionCommand | undefined {
  const args = command?.arguments;
  if (!command || !Array.isArray(args) || args.length !== 2 || typeof args[1] !== 'number') {
    return command;
  }
  return { ...command, arguments: [args[0], args[1] + typed] };
}
