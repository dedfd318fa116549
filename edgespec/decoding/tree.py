"""Token trees: several candidate continuations verified in one target decode, and exact acceptance on them.

Pure numpy. A `TokenTree` holds drafted nodes (token, parent, depth); the root is the context's last token, which
opens the verify batch (ROOT = -1 is its index). A node's children are ordered by rank (the order they were added)
and are all of one kind:

* deterministic (q = None): n-gram / suffix-index continuations, a draft model's top-b tokens;
* sampled (q = the probability row the token was drawn from): b draws from a draft's distribution, either i.i.d.
  (every sibling carries the same q; duplicates allowed) or without replacement (sibling j carries q with the
  tokens of siblings 1..j-1 removed and renormalised, see `sample_children`).

Mixed nodes (deterministic and sampled children under one parent) are refused: no drafter needs them. The rule
below would stay exact for them, but the tests do not cover it.

The target scores the tree once: p_rows[0] is its distribution after the context (the root row) and p_rows[i + 1]
its distribution after the path to node i (with the same `warp`, penalty history = context + that path). Rows of
nodes that were not decoded (ids past the target's vocabulary and their subtrees) may be None: such nodes have
p = 0 at their parent and are never accepted.

Exact acceptance, recursive rejection sampling (`accept_tree`). Start at the root with r = its row:

    for the children c_1..c_m of the current node, in rank order:
        accept c_j with probability min(1, r(x_j) / q_j(x_j))   (r normalised; q_j one-hot for a deterministic c_j)
        on rejection r <- max(0, r - q_j)                       (then renormalised)
    accepted: move to c_j and repeat; all rejected (or a leaf): emit x ~ r and stop.

For a deterministic child this is "try c_1 with probability p(c_1); on rejection set p(c_1) = 0 and renormalise;
try c_2 with p'(c_2); ...; sample what is left". For i.i.d. sampled children it is SpecInfer's multi-step
speculative sampling (Miao et al. 2024, "SpecInfer", Algorithm 2); for children sampled without replacement it is
recursive rejection sampling (Jeon et al. 2024, "Recursive Speculative Decoding: Accelerating LLM Inference via
Sampling Without Replacement"). Why every case is exact: given the residual r before trying c_j, the token x_j is
a fresh draw from q_j (whatever the earlier siblings were), so one step is ordinary speculative sampling of r with
proposal q_j; its output is distributed as r, with min(r, q_j) from acceptance and the rest from
normalise(max(0, r - q_j)), which is therefore exactly the law of the output given a rejection. By induction over
the siblings the emitted token (accepted child or final sample) follows the node's row, and given that child c_j
was accepted, c_j's own subtree is still a fresh draft for the next position (its draws never influenced the
decision), so the argument repeats one level down. Duplicated i.i.d. siblings need nothing special: a rejected
token keeps only its residual mass, and a duplicate is tried against that. Sampling without replacement never
wastes a slot on a duplicate and accepts at least as often in practice (RSD, section 4), so `sample_children`
draws without replacement by default.

Greedy (temperature 0): the target's row is one-hot, the rule keeps the child equal to the argmax
(`accept_tree_greedy` takes the argmax tokens directly). Seeded generations (`accept_tree_coupled`): the target's
token at depth d is sample_at(p, u_d) with the uniform fixed for that position; the child equal to it is kept, so
the output is plain seeded decoding's, token for token.

Random draws of `accept_tree`: one rng.random() per tried child, then one for the emitted token (via `sample`).
`outcome_distribution` computes the exact law of the rule's outcome on a given tree by enumerating its decisions
(for tests and analysis of small trees).

This module does not know llama.cpp, the models or the sampling settings: it gets rows and returns node indices.
`TreeBatch` (from `TokenTree.batch`) is the layout of the verify decode: one sequence id per root-to-leaf path, a
node shared by several paths carries all their ids, positions follow depth.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .acceptance import residual
from .sampling import sample_at

ROOT = -1
_Q_SUM_TOL = 1e-6  # a sampled node's q must sum to 1 within this


def _prob(row: np.ndarray, token: int) -> float:
    """row[token], or 0 for an id past the end of the row (padded vocabularies)."""
    return float(row[token]) if token < row.shape[0] else 0.0


# --------------------------------------------------------------------------------------------------- structure
@dataclass(frozen=True)
class TreeBatch:
    """The verify decode for a tree, independent of llama.cpp.

    tokens[r], positions[r], seq_ids[r]: batch row r (row 0 = the root, the context's last token at root_pos; it
    carries every sequence id). node_row[i]: the batch row of node i, -1 if node i is not decoded (an id past the
    target's vocabulary, or below one). parent_row[i]: the batch row whose logits predict node i. n_seqs: the
    number of sequence ids (root-to-leaf paths) 0..n_seqs-1; paths[s]: the nodes of sequence s, root to leaf.
    """

    tokens: list[int]
    positions: list[int]
    seq_ids: list[list[int]]
    node_row: list[int]
    parent_row: list[int]
    n_seqs: int
    paths: list[list[int]]


class TokenTree:
    """Drafted candidates as a tree (see the module docstring). Node indices are 0..n-1 in insertion order, so a
    parent always precedes its children (a topological order); ROOT = -1 is the context's last token."""

    def __init__(self) -> None:
        self._tokens: list[int] = []
        self._parents: list[int] = []
        self._depths: list[int] = []
        self._q: list[np.ndarray | None] = []
        self._children: list[list[int]] = []  # per node
        self._root_children: list[int] = []
        self._checked_q: set[int] = set()  # ids of q rows already validated (siblings share one)

    # -- building
    def add(self, parent: int, token: int, q: np.ndarray | None = None) -> int:
        """Add a child of `parent` (ROOT or a node index) with the next rank; returns its index.

        q None: a deterministic candidate. Otherwise the probability row (summing to 1) the token was drawn from,
        given its earlier siblings. A node's children must be all deterministic or all sampled."""
        if not (parent == ROOT or 0 <= parent < len(self._tokens)):
            raise ValueError(f"parent {parent} is not ROOT or an existing node (0..{len(self._tokens) - 1})")
        token = int(token)
        if token < 0:
            raise ValueError(f"token ids are >= 0, got {token}")
        siblings = self.children(parent)
        if siblings and (self._q[siblings[0]] is None) != (q is None):
            raise ValueError(f"node {parent} would mix deterministic and sampled children; a node's children are of one kind")
        if q is not None:
            q = self._check_q(q)
        index = len(self._tokens)
        self._tokens.append(token)
        self._parents.append(parent)
        self._depths.append(1 if parent == ROOT else self._depths[parent] + 1)
        self._q.append(q)
        self._children.append([])
        siblings.append(index)
        return index

    def _check_q(self, q: np.ndarray) -> np.ndarray:
        q = np.asarray(q)
        if id(q) in self._checked_q:
            return q
        if q.ndim != 1 or q.size == 0:
            raise ValueError(f"a q row must be a non-empty 1-D array, got shape {q.shape}")
        total = float(q.sum(dtype=np.float64))
        if not (q.min() >= 0.0) or abs(total - 1.0) > _Q_SUM_TOL:
            raise ValueError(f"a q row must be a probability row (non-negative, sum 1), got sum {total}")
        self._checked_q.add(id(q))
        return q

    @classmethod
    def chain(cls, tokens: Sequence[int], q: Sequence[np.ndarray | None] | None = None) -> "TokenTree":
        """A single path d_1..d_k (today's chain draft)."""
        tree = cls()
        node = ROOT
        for i, t in enumerate(tokens):
            node = tree.add(node, t, None if q is None else q[i])
        return tree

    @classmethod
    def from_paths(cls, paths: Sequence[Sequence[int]]) -> "TokenTree":
        """A deterministic trie of candidate continuations, best first: shared prefixes are merged and a child's
        rank is the rank of the first continuation through it."""
        tree = cls()
        index: dict[tuple[int, int], int] = {}  # (parent, token) -> node
        for path in paths:
            node = ROOT
            for t in path:
                key = (node, int(t))
                child = index.get(key)
                if child is None:
                    child = index[key] = tree.add(node, int(t))
                node = child
        return tree

    # -- reading
    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def tokens(self) -> list[int]:
        return list(self._tokens)

    @property
    def parents(self) -> list[int]:
        return list(self._parents)

    @property
    def depths(self) -> list[int]:
        """Depth of each node: 1 for the root's children."""
        return list(self._depths)

    @property
    def max_depth(self) -> int:
        return max(self._depths, default=0)

    def token(self, node: int) -> int:
        return self._tokens[node]

    def q(self, node: int) -> np.ndarray | None:
        return self._q[node]

    def children(self, node: int = ROOT) -> list[int]:
        """The children of `node` (ROOT or an index) in rank order. The returned list is the tree's own."""
        return self._root_children if node == ROOT else self._children[node]

    def is_sampled(self, node: int = ROOT) -> bool:
        """Whether `node`'s children are sampled (False for deterministic children and for leaves)."""
        kids = self.children(node)
        return bool(kids) and self._q[kids[0]] is not None

    def path(self, node: int) -> list[int]:
        """Node indices from the root's child down to `node` (empty for ROOT)."""
        out = []
        while node != ROOT:
            out.append(node)
            node = self._parents[node]
        return out[::-1]

    def path_tokens(self, node: int) -> list[int]:
        """The tokens on the path to `node`: appended to the context they are the history of node's row."""
        return [self._tokens[i] for i in self.path(node)]

    def leaves(self) -> list[int]:
        """Nodes without children, in depth-first rank order."""
        return [path[-1] for path in self.paths()]

    def paths(self) -> list[list[int]]:
        """Root-to-leaf node lists in depth-first rank order: paths()[s] is sequence id s of the batch."""
        out: list[list[int]] = []
        stack: list[tuple[int, list[int]]] = [(c, [c]) for c in reversed(self._root_children)]
        while stack:
            node, path = stack.pop()
            kids = self._children[node]
            if not kids:
                out.append(path)
            for c in reversed(kids):
                stack.append((c, path + [c]))
        return out

    def seq_ids(self) -> list[list[int]]:
        """For each node, the sequence ids (paths) through it, ascending."""
        out: list[list[int]] = [[] for _ in self._tokens]
        for s, path in enumerate(self.paths()):
            for node in path:
                out[node].append(s)
        return out

    def parent_rows(self) -> list[int]:
        """For each node, the p_rows index of the row that predicts it: 0 for the root's children, else parent + 1."""
        return [p + 1 for p in self._parents]

    def bfs_order(self) -> list[int]:
        """Nodes breadth first (by depth, then rank)."""
        out: list[int] = []
        todo = deque(self._root_children)
        while todo:
            node = todo.popleft()
            out.append(node)
            todo.extend(self._children[node])
        return out

    def ancestor_mask(self) -> np.ndarray:
        """(n + 1, n + 1) booleans over p_rows order (0 = root, i + 1 = node i): [a, b] is True when row b is
        row a or an ancestor of it, i.e. what row a may attend to within the tree (tree attention)."""
        n = len(self._tokens)
        mask = np.eye(n + 1, dtype=bool)
        mask[:, 0] = True
        for i in range(n):
            p = self._parents[i]
            if p != ROOT:
                mask[i + 1] |= mask[p + 1]
        return mask

    def batch(self, last_token: int, root_pos: int, n_vocab: int | None = None, skip: Collection[int] = ()) -> TreeBatch:
        """The verify decode: row 0 = last_token at root_pos with every sequence id, then the decodable nodes in
        index order, each at root_pos + depth with the ids of the paths through it. With n_vocab, nodes whose id
        is >= n_vocab, and their subtrees, are left out (node_row -1): their p is 0 at the parent, so they are
        rejected whatever their subtree says, and llama.cpp cannot decode them. Nodes in `skip` (tokens a constraint
        forbids there: p = 0 too) and their subtrees are left out the same way."""
        paths = self.paths()
        seqs = self.seq_ids()
        all_ids = list(range(len(paths)))
        tokens, positions, seq_ids = [int(last_token)], [int(root_pos)], [all_ids]
        node_row = [-1] * len(self._tokens)
        for i, t in enumerate(self._tokens):
            p = self._parents[i]
            if (n_vocab is not None and t >= n_vocab) or (p != ROOT and node_row[p] < 0) or i in skip:
                continue
            node_row[i] = len(tokens)
            tokens.append(t)
            positions.append(int(root_pos) + self._depths[i])
            seq_ids.append(seqs[i])
        parent_row = [0 if p == ROOT else node_row[p] for p in self._parents]
        return TreeBatch(tokens, positions, seq_ids, node_row, parent_row, len(paths), paths)


# --------------------------------------------------------------------------------------------------- acceptance
@dataclass(frozen=True)
class TreeVerdict:
    """The outcome of verifying a tree: the accepted nodes (a path from the root's child down), their tokens, and
    the next token: the sample at the deepest accepted node after its children were all rejected (bonus False), or
    a plain sample of its row when it has no children (bonus True)."""

    path: list[int]
    tokens: list[int]
    token: int
    bonus: bool

    @property
    def n_accepted(self) -> int:
        return len(self.path)

    @property
    def emitted(self) -> list[int]:
        """The tokens this cycle adds: the accepted ones, then the next token."""
        return self.tokens + [self.token]


class Draws(Protocol):
    """The randomness of the rule, so that the same code runs with an rng and under exact enumeration."""

    def accept(self, num: float, den: float) -> bool:
        """True with probability min(1, num / den) (den > 0)."""
        ...

    def choose(self, weights: np.ndarray) -> int:
        """An index drawn with probability weights / sum(weights)."""
        ...


class RngDraws:
    """Draws from an np.random.Generator: one rng.random() per call."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def accept(self, num: float, den: float) -> bool:
        return self.rng.random() * den < num

    def choose(self, weights: np.ndarray) -> int:
        return sample_at(weights, self.rng.random())


PRows = Sequence["np.ndarray | None"] | np.ndarray


def _check_rows(tree: TokenTree, p_rows: Sequence[object] | np.ndarray) -> None:
    if len(p_rows) != len(tree) + 1:
        raise ValueError(f"need one target row per node plus the root row: {len(tree) + 1}, got {len(p_rows)}")


def _row(p_rows: PRows, node: int) -> np.ndarray:
    row = p_rows[node + 1]
    if row is None:
        raise ValueError(f"node {node} was accepted but its target row is missing (not decoded)")
    return np.asarray(row)


def accept_tree_with(tree: TokenTree, p_rows: PRows, draws: Draws) -> TreeVerdict:
    """The exact tree rule (module docstring) with its randomness supplied by `draws`."""
    _check_rows(tree, p_rows)
    path: list[int] = []
    node = ROOT
    while True:
        row = _row(p_rows, node)
        kids = tree.children(node)
        r = np.asarray(row, dtype=np.float64)
        chosen = None
        for c in kids:
            x, q = tree.token(c), tree.q(c)
            z = float(r.sum())  # r is kept unnormalised: p'(x) = r(x) / z
            q_x = 1.0 if q is None else _prob(q, x)
            if q_x > 0.0 and z > 0.0:
                accepted = draws.accept(_prob(r, x), q_x * z)
            else:  # q(x) = 0: no evidence, rejected (one draw all the same, so every tried child takes one)
                accepted = draws.accept(0.0, 1.0)
            if accepted:
                chosen = c
                break
            # max(0, p' - q) = max(0, r - z q) / z; for a deterministic child: r with x removed
            r = np.asarray(residual(r, None if q is None else z * np.asarray(q, dtype=np.float64), x))
        if chosen is None:
            if not r.any():  # rejection had probability 0 (rounding or a q(x) = 0 claim): sample the row itself
                r = np.asarray(row, dtype=np.float64)
            return TreeVerdict(path, [tree.token(i) for i in path], draws.choose(r), not kids)
        path.append(chosen)
        node = chosen


def accept_tree(tree: TokenTree, p_rows: PRows, rng: np.random.Generator) -> TreeVerdict:
    """Verify a tree exactly at any temperature (module docstring). p_rows: the root row then one row per node
    (None for nodes not decoded), each the target's warped distribution after the context + path."""
    return accept_tree_with(tree, p_rows, RngDraws(rng))


def accept_tree_greedy(tree: TokenTree, target_tokens: Sequence[int | None]) -> TreeVerdict:
    """Temperature 0: target_tokens[0] is the target's argmax after the context, target_tokens[i + 1] after node i
    (None for nodes not decoded). Follows the first child equal to the target's token; the next token is the
    target's token at the deepest accepted node. Equal to accept_tree with one-hot rows."""
    _check_rows(tree, target_tokens)
    path: list[int] = []
    node = ROOT
    while True:
        x = target_tokens[node + 1]
        if x is None:
            raise ValueError(f"node {node} was accepted but its target token is missing (not decoded)")
        kids = tree.children(node)
        nxt = next((c for c in kids if tree.token(c) == int(x)), None)
        if nxt is None:
            return TreeVerdict(path, [tree.token(i) for i in path], int(x), not kids)
        path.append(nxt)
        node = nxt


def accept_tree_coupled(tree: TokenTree, p_rows: PRows, uniforms: Sequence[float]) -> TreeVerdict:
    """Seeded generations (common random numbers, see acceptance.accept_coupled): uniforms[d] is the uniform fixed
    for the token at depth d + 1 (the position root_pos + d + 1); the target's token there is sample_at(p, u_d).
    The first child equal to it is kept. Output = plain seeded decoding, token for token."""
    _check_rows(tree, p_rows)
    if len(uniforms) < tree.max_depth + 1:
        raise ValueError(f"need {tree.max_depth + 1} uniforms (one per depth, bonus included), got {len(uniforms)}")
    path: list[int] = []
    node = ROOT
    while True:
        x = sample_at(_row(p_rows, node), float(uniforms[len(path)]))
        kids = tree.children(node)
        nxt = next((c for c in kids if tree.token(c) == x), None)
        if nxt is None:
            return TreeVerdict(path, [tree.token(i) for i in path], x, not kids)
        path.append(nxt)
        node = nxt


# --------------------------------------------------------------------------------------------------- drafting
def walk(tree: TokenTree, emitted: Sequence[int]) -> list[tuple[int, int, bool]]:
    """What verification tried, from the tokens the cycle emitted: (depth, rank, accepted) for each candidate tried,
    in order (children are tried by rank until one is accepted; all of them when none is)."""
    out: list[tuple[int, int, bool]] = []
    node = ROOT
    for depth, tok in enumerate(emitted, start=1):
        kids = tree.children(node)
        nxt = None
        for rank, c in enumerate(kids):
            hit = tree.token(c) == tok
            out.append((depth, rank, hit))
            if hit:
                nxt = c
                break
        if nxt is None:
            break
        node = nxt
    return out


def sample_children(
    q_row: np.ndarray, b: int, rng: np.random.Generator, *, replacement: bool = False
) -> list[tuple[int, np.ndarray]]:
    """b draws from the probability row q_row, each with the row it was drawn from (to pass to TokenTree.add).

    replacement False (the default): without replacement, sibling j's row is q with siblings 1..j-1 removed and
    renormalised (fewer than b when q has fewer positive entries). True: i.i.d., every sibling carries the same
    row. One rng.random() per draw; a few passes over the row per sibling."""
    q = np.asarray(q_row, dtype=np.float64)
    q = q / q.sum()
    out: list[tuple[int, np.ndarray]] = []
    for _ in range(b):
        if not q.any():
            break
        x = sample_at(q, rng.random())
        out.append((x, q))
        if not replacement:
            q = q.copy()
            q[x] = 0.0
            total = q.sum()
            q = q / total if total > 0 else q
    return out


# --------------------------------------------------------------------------------------------------- enumeration
class _Branch(Exception):
    def __init__(self, options: list[tuple[object, float]]) -> None:
        self.options = options


class _ScriptedDraws:
    """Replays a list of decisions; raises _Branch at the first undecided random decision."""

    def __init__(self, script: tuple[object, ...]) -> None:
        self.script = script
        self.i = 0
        self.weight = 1.0

    def _next(self, options: list[tuple[object, float]]) -> object:
        live = [(v, w) for v, w in options if w > 0.0]
        if len(live) == 1:
            return live[0][0]
        if self.i == len(self.script):
            raise _Branch(live)
        choice = self.script[self.i]
        self.i += 1
        self.weight *= dict(live)[choice]
        return choice

    def accept(self, num: float, den: float) -> bool:
        a = min(1.0, num / den) if den > 0 else 0.0
        return bool(self._next([(True, a), (False, 1.0 - a)]))

    def choose(self, weights: np.ndarray) -> int:
        w = np.asarray(weights, dtype=np.float64)
        w = w / w.sum()
        choice = self._next([(int(i), float(w[i])) for i in np.flatnonzero(w > 0)])
        assert isinstance(choice, int)
        return choice


def outcome_distribution(
    tree: TokenTree,
    p_rows: PRows,
    rule: Callable[[TokenTree, PRows, Draws], TreeVerdict] = accept_tree_with,
) -> dict[tuple[tuple[int, ...], int], float]:
    """The exact law of rule(tree, p_rows, .): {(accepted path, next token): probability}, by enumerating every
    random decision the rule takes (exponential in the tree: for tests and small analyses)."""
    out: dict[tuple[tuple[int, ...], int], float] = {}
    todo: list[tuple[object, ...]] = [()]
    while todo:
        script = todo.pop()
        draws = _ScriptedDraws(script)
        try:
            v = rule(tree, p_rows, draws)
        except _Branch as branch:
            todo.extend(script + (choice,) for choice, _ in branch.options)
            continue
        key = (tuple(v.path), v.token)
        out[key] = out.get(key, 0.0) + draws.weight
    return out


__all__ = [
    "ROOT",
    "Draws",
    "RngDraws",
    "TokenTree",
    "TreeBatch",
    "TreeVerdict",
    "accept_tree",
    "accept_tree_coupled",
    "accept_tree_greedy",
    "accept_tree_with",
    "outcome_distribution",
    "sample_children",
    "walk",
]
