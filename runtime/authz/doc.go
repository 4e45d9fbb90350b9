// Package authz decides who may do what in a cluster: least privilege on every route and
// link. It holds the principals (a role and its scope), the scoped tokens and the
// certificate grants that name them, the authentication that turns a request's token and
// certificate into a principal, and the one table of role × action that the heads, the
// agents, actor remote and the transfer plane consult. It does no I/O: what a decision
// needs of the cluster's records (where a gang member runs, whose an object is) comes
// through the State interface its caller implements.
//
// Principals, and who holds them:
//
//	admin                        the operator's atoll CLI, a driver holding the cluster token
//	head                         a head (its own certificate, signed with the CA it holds)
//	agent/<machine>              a machine's agent
//	driver/<job>                 a driver given `atoll token create --role driver --job NAME`,
//	                             or a driver that `atoll submit` started
//	worker/<job>/<gang>/<rank>   a worker process an agent started
//
// A request is decided in two steps:
//
//	p, err := authn.Authenticate(bearer, r.TLS) // 401 when it fails
//	err = authz.Decide(p, authz.ActJobWrite, authz.Target{Job: name}, state) // 403: *Denied
//
// Table is the table itself; docs/hardening.md shows it (Markdown), and a test keeps the
// two the same.
package authz
