import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';
import { AdaptiveDebounce, likelihood } from '../../src/debounce';

const MID_WORD = { charBefore: 'a', lineAfter: 'bc)', textAfter: 'bc)\nmore' };
const LINE_END = { charBefore: ':', lineAfter: '', textAfter: '' };

describe('AdaptiveDebounce', () => {
  it('waits longer mid-word than at the end of a line, from a 200 ms rhythm at first', () => {
    const debounce = new AdaptiveDebounce();
    assert.equal(debounce.delay(0, MID_WORD, 0), 600); // 3.0 x 200 ms
    assert.equal(debounce.delay(10_000, LINE_END, 0), 300); // 1.5 x 200 ms
  });

  it('learns the typing rhythm after 20 keystroke gaps and ignores pauses', () => {
    const debounce = new AdaptiveDebounce();
    let now = 0;
    for (let key = 0; key < 25; key++) {
      debounce.delay(now, MID_WORD, 0);
      now += 120;
    }
    now += 5000; // a pause is not a gap
    assert.equal(debounce.delay(now, LINE_END, 0), 180); // 1.5 x 120 ms
  });

  it('takes the server\'s response time off the wait, within 100 ms to 1 s', () => {
    const debounce = new AdaptiveDebounce();
    assert.equal(debounce.delay(0, LINE_END, 150), 150);
    assert.equal(debounce.delay(10_000, LINE_END, 5000), 100);
  });
});

describe('likelihood', () => {
  it('adds the three places where a completion is likely wanted', () => {
    assert.equal(likelihood(MID_WORD), 0);
    assert.equal(likelihood(LINE_END), 1);
    assert.equal(likelihood({ charBefore: '(', lineAfter: ')', textAfter: ')\nx = 1' }), 0.9);
  });
});
