package envd

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// errUnknownUser is returned when a user name has no /etc/passwd entry.
var errUnknownUser = errors.New("unknown user")

// account is one /etc/passwd entry plus the groups the user belongs to.
type account struct {
	Name   string
	UID    uint32
	GID    uint32
	Home   string
	Shell  string
	Groups []uint32 // supplementary groups from /etc/group, primary GID included
}

// userDB reads the sandbox's account files on every lookup: they are small
// and may change while envd runs (useradd inside the sandbox). Parsing them
// ourselves keeps envd free of cgo and of the host's NSS configuration.
type userDB struct {
	passwdPath string
	groupPath  string
}

// lookupUser returns the account called name, or errUnknownUser.
func (db userDB) lookupUser(name string) (account, error) {
	var found *account
	err := scanColonFile(db.passwdPath, func(f []string) bool {
		if len(f) < 7 || f[0] != name {
			return true
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			return true
		}
		found = &account{Name: f[0], UID: uint32(uid), GID: uint32(gid), Home: f[5], Shell: f[6]}
		return false
	})
	if err != nil {
		return account{}, fmt.Errorf("lookup user %q: %w", name, err)
	}
	if found == nil {
		return account{}, fmt.Errorf("lookup user %q: %w", name, errUnknownUser)
	}
	groups, err := db.groupsOf(found.Name, found.GID)
	if err != nil {
		return account{}, fmt.Errorf("lookup groups of %q: %w", name, err)
	}
	found.Groups = groups
	return *found, nil
}

// groupsOf lists the primary GID and every group naming user as a member.
func (db userDB) groupsOf(user string, primary uint32) ([]uint32, error) {
	groups := []uint32{primary}
	err := scanColonFile(db.groupPath, func(f []string) bool {
		if len(f) < 4 {
			return true
		}
		gid, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil || uint32(gid) == primary {
			return true
		}
		for _, member := range strings.Split(f[3], ",") {
			if member == user {
				groups = append(groups, uint32(gid))
				break
			}
		}
		return true
	})
	if errors.Is(err, os.ErrNotExist) {
		return groups, nil
	}
	return groups, err
}

// userName maps a UID to its name, or its decimal form when it has none.
func (db userDB) userName(uid uint32) string {
	return db.nameByID(db.passwdPath, uid)
}

// groupName maps a GID to its name, or its decimal form when it has none.
func (db userDB) groupName(gid uint32) string {
	return db.nameByID(db.groupPath, gid)
}

func (db userDB) nameByID(path string, id uint32) string {
	want := strconv.FormatUint(uint64(id), 10)
	name := want
	_ = scanColonFile(path, func(f []string) bool {
		if len(f) >= 3 && f[2] == want {
			name = f[0]
			return false
		}
		return true
	})
	return name
}

// scanColonFile calls visit with the colon-separated fields of each
// non-comment line until visit returns false.
func scanColonFile(path string, visit func(fields []string) bool) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if !visit(strings.Split(line, ":")) {
			return nil
		}
	}
	return sc.Err()
}
