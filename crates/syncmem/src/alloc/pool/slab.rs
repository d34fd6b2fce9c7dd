//! A slab: values in a `Vec`, addressed by their slot, slots reused after removal. The pools
//! keep their blocks in one, so a block id is an index (no hashing) and a steady state of
//! allocations and frees allocates nothing.

use super::BlockId;

/// Values addressed by [`BlockId`] (their slot).
pub(crate) struct Slab<T> {
    slots: Vec<Option<T>>,
    vacant: Vec<BlockId>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            vacant: Vec::new(),
        }
    }
}

impl<T> Slab<T> {
    /// Stores `value` and returns its id.
    pub(crate) fn insert(&mut self, value: T) -> BlockId {
        match self.vacant.pop() {
            Some(id) => {
                self.slots[id as usize] = Some(value);
                id
            }
            None => {
                self.slots.push(Some(value));
                (self.slots.len() - 1) as BlockId
            }
        }
    }

    /// Removes and returns the value of `id`.
    pub(crate) fn remove(&mut self, id: BlockId) -> Option<T> {
        let v = self.slots.get_mut(id as usize)?.take()?;
        self.vacant.push(id);
        Some(v)
    }

    /// The value of `id`.
    pub(crate) fn get(&self, id: BlockId) -> Option<&T> {
        self.slots.get(id as usize)?.as_ref()
    }

    /// The value of `id`, mutably.
    pub(crate) fn get_mut(&mut self, id: BlockId) -> Option<&mut T> {
        self.slots.get_mut(id as usize)?.as_mut()
    }

    /// Every stored value with its id.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (BlockId, &T)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.as_ref().map(|v| (i as BlockId, v)))
    }
}

impl<T> std::ops::Index<BlockId> for Slab<T> {
    type Output = T;
    fn index(&self, id: BlockId) -> &T {
        self.get(id).expect("a live block id")
    }
}

impl<T> std::ops::IndexMut<BlockId> for Slab<T> {
    fn index_mut(&mut self, id: BlockId) -> &mut T {
        self.get_mut(id).expect("a live block id")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused() {
        let mut s = Slab::default();
        let a = s.insert("a");
        let b = s.insert("b");
        assert_ne!(a, b);
        assert_eq!(s.remove(a), Some("a"));
        assert_eq!(s.remove(a), None, "removed once");
        assert_eq!(s.get(a), None);
        let c = s.insert("c");
        assert_eq!(c, a, "the vacant slot is reused");
        assert_eq!(s[b], "b");
        s[c] = "d";
        let all: Vec<_> = s.iter().collect();
        assert_eq!(all, [(a, &"d"), (b, &"b")]);
        assert_eq!(s.get(99), None);
    }
}
