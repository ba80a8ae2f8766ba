package api

import (
	"net/http"
	"time"
)

// pageKey is where an item stands in a list: lists are ordered by a time
// and then by ID, and a nextToken is the key of the last item served.
type pageKey struct {
	at time.Time
	id string
}

// newestFirst orders by time, newest first, then by ID ascending or
// descending; oldestFirst is the reverse of newestFirst with the same
// tie order.
func newestFirst(idAscending bool) func(a, b pageKey) bool {
	return func(a, b pageKey) bool {
		if !a.at.Equal(b.at) {
			return a.at.After(b.at)
		}
		if idAscending {
			return a.id < b.id
		}
		return a.id > b.id
	}
}

func oldestFirst(idAscending bool) func(a, b pageKey) bool {
	newer := newestFirst(idAscending)
	return func(a, b pageKey) bool { return newer(b, a) }
}

// page serves one page of items (already in list order, as before says):
// the ones after the nextToken cursor, at most limit of them. When more
// follow, it sets X-Next-Token.
func page[T any](w http.ResponseWriter, items []T, key func(T) pageKey, before func(a, b pageKey) bool,
	token string, limit int) ([]T, error) {
	if token != "" {
		at, id, err := parsePageToken(token)
		if err != nil {
			return nil, err
		}
		cursor := pageKey{at, id}
		i := 0
		for i < len(items) && !before(cursor, key(items[i])) {
			i++
		}
		items = items[i:]
	}
	if len(items) > limit {
		last := key(items[limit-1])
		w.Header().Set("X-Next-Token", pageToken(last.at, last.id))
		items = items[:limit]
	}
	return items, nil
}
