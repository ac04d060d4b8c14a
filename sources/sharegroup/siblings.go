package sharegroup

import "sync"

// siblings are the subtasks of one source operator that a deployment made
// in this process from one factory (New), by attempt. When one of them
// closes, every lane of every sibling of its attempt stops fetching before
// any of them releases a record: the attempt is ending, and a lane still
// fetching would acquire the records its siblings release (a delivery each)
// only to release them again when it closes (docs/architecture.md,
// "Delivery budget").
type siblings[T any] struct {
	mu      sync.Mutex
	members map[siblingKey]map[*Source[T]]struct{}
}

// siblingKey names the subtasks of one operator in one attempt.
type siblingKey struct {
	job, uid string
	attempt  int
}

func newSiblings[T any]() *siblings[T] {
	return &siblings[T]{members: map[siblingKey]map[*Source[T]]struct{}{}}
}

func (g *siblings[T]) join(k siblingKey, s *Source[T]) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.members[k] == nil {
		g.members[k] = map[*Source[T]]struct{}{}
	}
	g.members[k][s] = struct{}{}
}

func (g *siblings[T]) leave(k siblingKey, s *Source[T]) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.members[k], s)
	if len(g.members[k]) == 0 {
		delete(g.members, k)
	}
}

// stopFetching stops the fetching of every sibling of attempt k, all at
// once, and returns when none fetches any more.
func (g *siblings[T]) stopFetching(k siblingKey) {
	g.mu.Lock()
	var all []*Source[T]
	for s := range g.members[k] {
		all = append(all, s)
	}
	g.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.stopFetching()
		}()
	}
	wg.Wait()
}
