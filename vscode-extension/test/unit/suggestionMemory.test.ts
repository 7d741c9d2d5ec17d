import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';
import { SuggestionMemory } from '../../src/suggestionMemory';

const URI = 'file:///a.py';
const BEFORE = 'def add(a, b):';
const AFTER = '\n\nprint(add(1, 2))\n';
const COMMAND = { title: 'accepted', command: 'specComplete.didAcceptCompletion', arguments: ['s1', 0] };
const ITEM = { insertText: '\n    return a + b', command: COMMAND };

function remembered(): SuggestionMemory {
  const memory = new SuggestionMemory();
  memory.remember(URI, BEFORE + AFTER, BEFORE.length, ITEM);
  return memory;
}

describe('SuggestionMemory', () => {
  it('answers typing through a suggestion with its rest, counting the typed characters in the command', () => {
    const typed = '\n    ret';
    const answer = remembered().answer(URI, BEFORE + typed + AFTER, BEFORE.length + typed.length);
    assert.deepEqual(answer, { insertText: 'urn a + b', command: { ...COMMAND, arguments: ['s1', typed.length] } });
  });

  it('answers the same state again (an undo or redo back to it)', () => {
    assert.deepEqual(remembered().answer(URI, BEFORE + AFTER, BEFORE.length), ITEM);
  });

  it('does not answer other text, other edits, other documents, or a suggestion typed to its end', () => {
    const memory = remembered();
    assert.equal(memory.answer(URI, BEFORE + '\n    x' + AFTER, BEFORE.length + 6), undefined);
    assert.equal(memory.answer(URI, '#' + BEFORE + '\n' + AFTER, BEFORE.length + 2), undefined);
    assert.equal(memory.answer(URI, BEFORE + '\n' + AFTER + '#', BEFORE.length + 1), undefined);
    assert.equal(memory.answer('file:///b.py', BEFORE + '\n' + AFTER, BEFORE.length + 1), undefined);
    assert.equal(memory.answer(URI, BEFORE + ITEM.insertText + AFTER, BEFORE.length + ITEM.insertText.length), undefined);
  });

  it('forgets a closed document and keeps 16 suggestions at most', () => {
    const memory = remembered();
    memory.forget(URI);
    assert.equal(memory.answer(URI, BEFORE + AFTER, BEFORE.length), undefined);
    for (let index = 0; index <= 16; index++) {
      memory.remember(URI, `x${index}`, 2, { insertText: 'y', command: undefined });
    }
    assert.equal(memory.answer(URI, 'x0', 2), undefined);
    assert.deepEqual(memory.answer(URI, 'x16', 2), { insertText: 'y', command: undefined });
  });
});
