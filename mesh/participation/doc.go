// Package participation decides whether this node takes work from the mesh: the owner's
// consent, the deployer's profile, the live device conditions, hysteresis and a rate limit.
// It is policy as plain functions. It starts no goroutines, keeps no package state and reads
// no clock: every call that needs the time takes now. Apart from the consent, consent wording
// and overrides files it does no I/O. It imports the standard library, mesh/caps (for the
// thermal and app state names, and ConditionsOf) and internal/atomicfile (the consent file's
// replacement), nothing else. The node owns the heartbeat loop, the sensors, the traffic
// count and the lock: every heartbeat it reads the Conditions and its TrafficMeter, calls
// Governor.ObserveTraffic and announces State.Accepting; when a peer's task arrives it asks
// the Governor, checks the traffic cap and asks a RateLimiter.
//
// # Who decides what
//
//   - The deployer (whoever installs and starts the node) picks a profile with --profile and
//     may change any of its fields in an overrides file, looser or stricter.
//   - The owner (whoever the machine belongs to) gives consent, with their own limits on
//     every field the deployer sets but off: battery floor, require charging, thermal
//     ceiling, tasks per minute, pausing on metered networks, the traffic cap and the memory
//     share. The owner can only tighten: the effective policy is Stricter(deployer, owner),
//     field by field.
//   - The machine reports its conditions every heartbeat. A breach of the effective policy
//     pauses mesh work at once.
//
// # Profiles
//
// battery_min_level applies only on battery; thermal_max_state is the highest thermal state
// at which work goes on (nominal < fair < serious < critical); max_tasks_per_min counts tasks
// admitted from peers in any 60 s window; max_bytes_per_hour caps the mesh traffic of the
// tasks served for peers in any hour (see Traffic cap); max_memory_share caps the memory
// given to mesh work (see Memory share).
//
//	| profile            | off | require_charging | battery_min_level | thermal_max_state | max_tasks_per_min | pause_on_metered | max_bytes_per_hour | max_memory_share |
//	|--------------------|-----|------------------|-------------------|-------------------|-------------------|------------------|--------------------|------------------|
//	| eco                | no  | yes              | 50 %              | fair              | 10                | yes              | none               | 25 %             |
//	| standard (default) | no  | no               | 30 %              | fair              | 30                | yes              | none               | 50 %             |
//	| power              | no  | no               | 15 %              | serious           | 120               | no               | none               | 75 %             |
//	| off                | yes | no               | 30 %              | fair              | 30                | yes              | none               | 50 %             |
//
// eco is for a laptop its owner uses: work only while charging and at least half full, at
// most 10 tasks a minute. standard pauses at the consent prompt's default floor (30 %), as
// soon as the machine is warm enough to notice (fair, before the system throttles), and on
// metered networks, with at most 30 tasks a minute. power is for a machine set aside for the
// mesh: it runs down to 15 %, just above the 10 % at which most systems warn, tolerates
// serious (throttled but not critical), takes 120 tasks a minute and ignores metering. off
// pauses whatever the conditions and keeps standard's thresholds, so status shows real
// numbers and switching back to standard changes only off. No profile caps traffic: how much
// a data plan allows is known to whoever deploys or owns the machine, not to a profile.
// Memory follows the same lines: a quarter of what is free on eco (the owner's own programs
// keep most of it), half on standard (the node's default budget), three quarters on power.
//
// # The effective policy
//
// Stricter keeps, field by field:
//
//	| field                                     | stricter value                                  |
//	|-------------------------------------------|-------------------------------------------------|
//	| off, require_charging, pause_on_metered   | yes if either says yes                          |
//	| battery_min_level                         | the higher                                      |
//	| thermal_max_state                         | the lower state                                 |
//	| max_tasks_per_min, max_bytes_per_hour,    | the smaller limit; 0 is no limit, so 0 and n: n |
//	| max_memory_share                          |                                                 |
//
// The owner's part (Consent.OwnerPolicy) is every field but off, from the consent record:
//
//	| policy field       | consent record field | the owner's loosest (keeps the deployer's) |
//	|--------------------|----------------------|--------------------------------------------|
//	| battery_min_level  | battery_floor        | 0                                          |
//	| require_charging   | require_charging     | false                                      |
//	| thermal_max_state  | thermal_max_state    | critical, or absent                        |
//	| max_tasks_per_min  | max_tasks_per_min    | 0 (no limit)                               |
//	| pause_on_metered   | pause_on_metered     | false                                      |
//	| max_bytes_per_hour | max_bytes_per_hour   | 0 (no cap)                                 |
//	| max_memory_share   | max_memory_share     | 0 or absent (no cap)                       |
//
// Off stays the deployer's: the owner's way to stop contributing is to withdraw or answer
// no. Effective = Stricter(deployer, owner), so whatever the owner sets, the result is never
// looser than the deployer's policy, and never looser than the owner's.
//
// # Deployer overrides
//
// The profile is the one --profile names; when the flag is not given, the overrides file's
// "profile"; else standard. A flag given explicitly wins over the file because it is the more
// specific, more recent choice. Then every field set in the file replaces the profile's value.
// The file is one JSON object of at most 64 KiB, with exactly these keys, each optional
// (null counts as absent):
//
//	{"profile": "eco", "require_charging": false, "battery_min_level": 40,
//	 "thermal_max_state": "fair", "max_tasks_per_min": 20, "pause_on_metered": true,
//	 "max_bytes_per_hour": 500000000, "max_memory_share": 30}
//
// An unknown key, a value of the wrong type or out of range (battery_min_level 0-100,
// max_tasks_per_min 0-10,000, max_bytes_per_hour 0-10^15, max_memory_share 0-100, a known
// profile and thermal state), or anything after the object is an error naming the file and
// the field.
//
// # Consent
//
// Nothing is contributed before the owner agrees to ConsentWording (version ConsentVersion,
// 1), which offers three separate choices (run locally, contribute to the mesh, cloud
// fallback), a battery floor (default 30 %) and pausing on metered networks (default yes);
// the owner may set the other limits too (see The effective policy). The answer is stored in
// the data dir as consent.json (mode 0600, written to a temporary file, synced and renamed).
// A record given to another wording version, or one that does not parse, is an error that
// says to run `meshinfer consent` again: the owner has not agreed to what this build would
// do. `meshinfer consent --withdraw` removes the file.
//
// The deployer may replace the wording with their own text (--consent-text FILE, read by
// LoadConsentWording: UTF-8, not blank, at most 64 KiB). The record keeps the SHA-256 of the
// wording it was given to, in wording_sha256 (WordingHash; the built-in wording's is
// DefaultWordingHash). A node whose wording hashes otherwise treats the consent as not given
// (Consent.GivenFor): it contributes nothing and uses no cloud until the owner answers the
// new wording. A record without wording_sha256 was written before the wording could be
// configured, so it was given to the built-in wording, and counts as DefaultWordingHash:
// such a record stays valid on a node with the built-in wording, and asks again on one with
// the deployer's own. The built-in wording changes only with a new ConsentVersion, so an old
// record can never stand for a wording its owner did not see.
//
// Only Contribute concerns this package: callers pass consented = (consent recorded &&
// Contribute). RunLocal and CloudFallback are the routing's business.
//
// # Conditions and reasons
//
// Breaches reports, in this order:
//
//	| reason         | when                                                                        |
//	|----------------|-----------------------------------------------------------------------------|
//	| profile_off    | the effective policy is off                                                 |
//	| no_consent     | no consent recorded, it does not allow contributing, or it was given to     |
//	|                | another wording than the node's (Consent.GivenFor)                          |
//	| sensors_silent | the sensors did not answer, or gave a battery level outside 0-100           |
//	| battery_low    | a battery is present and its level is below battery_min_level               |
//	| not_charging   | require_charging, and a battery is present and not charging                 |
//	| thermal        | the thermal state is above thermal_max_state, or is not a known state       |
//	| app_background | the app state is background (or is not a known state), whatever the policy |
//	| metered        | pause_on_metered, and the network is metered                                |
//	| bandwidth_cap  | (TrafficBreaches) max_bytes_per_hour is set and the last hour's mesh        |
//	|                | traffic reached it; judged even with silent sensors                         |
//	| rate_limited   | (admission only) max_tasks_per_min tasks were admitted in the last 60 s     |
//
// Sensors are fail closed: when they are silent no reading after sensors_silent is judged,
// because no reading is trusted; bandwidth_cap is the node's own count, not a reading, and
// is judged anyway (TrafficBreaches, after Breaches). A machine without a battery is on
// mains and never breaches battery_low or not_charging. An unknown thermal reading (the
// empty string included) breaches every policy: the probe reports nominal for a machine
// without thermal zones, so anything else means the reading went wrong. A policy whose
// thermal_max_state is unknown allows no state at all.
//
// The app state is a phone's or a browser's: foreground and background-task (a background
// task the OS granted: iOS BGProcessingTask, an Android foreground service) may work;
// background pauses under every profile, because the OS may suspend the app at any moment and
// a task taken then would be cut off. A desktop is always foreground. Like thermal, an
// unknown app state breaches.
//
// ConditionsOf reads the conditions from a capability vector, so a phone's or a browser's
// thermal state, app state, battery and metered flag feed Breaches exactly as a desktop's
// do; the node builds its own conditions the same way, from the vector its probe gives.
//
// # What a pause covers
//
// While paused, for any reason, the node announces accepting=false, refuses new tasks from
// peers (policy_paused, a rejection that reputation does not penalize) and lets the tasks in
// flight finish. Pause on metered, like every other pause, therefore covers inference for
// other people's requests and transfers of model weights made for mesh work. It does not cover
// the capability announcement (one small signed vector per heartbeat: the only way peers
// learn that the node is paused), DHT and bootstrap upkeep, the owner's own requests
// (local, or sent to the mesh or the cloud as the owner asked), or the local console.
//
// # Hysteresis
//
// A Governor turns observations into an admission state. Any breach pauses at once, on the
// observation that sees it. A paused node resumes on the first observation at which both
// hold: the last RecoverBeats observations (default 3) had no breach, and at least
// BackoffWindow (default 8 heartbeats) has passed since its previous resume. At the 15 s
// heartbeat that is:
//
//	| event           | at the defaults                                                          |
//	|-----------------|--------------------------------------------------------------------------|
//	| pause           | the first heartbeat that sees a breach (within 15 s of it)               |
//	| resume          | the 3rd healthy heartbeat in a row: 30 s after the first healthy one     |
//	| backoff         | 2 min between resumes: at most one pause→resume cycle per 2 min          |
//	| start           | paused (sensors_silent) until the first observation; a healthy one       |
//	|                 | resumes at once (there is no history to smooth) and starts no backoff    |
//
// While paused, State.Reasons lists the current breaches, or, when the latest observation had
// none and the node is waiting out its recovery, the breaches of the latest observation that
// had some. Withdrawing consent and switching to profile off are breaches like the rest: the
// caller observes at once, and the node pauses at once.
//
// # Traffic cap
//
// max_bytes_per_hour caps the mesh traffic this node moves while contributing: the bytes in
// and out of the streams on which it serves tasks for peers (the node says which, in
// node/traffic.go), refused requests included, counted as they pass. Upkeep that a pause does
// not stop (announcements, DHT, identify) and the owner's own requests are not counted, so
// a paused node's count only falls. A TrafficMeter keeps the count per minute of the clock
// for the last hour: bytes moved at t count until the first minute boundary at least an hour
// after t, never less than an hour.
//
// When the count reaches the cap the node pauses (bandwidth_cap): the admission that finds it
// reached refuses the task and observes at once, so the node re-announces itself as not
// accepting, and every heartbeat after observes it until the count falls below the cap.
// Then the node resumes as after any other breach (RecoverBeats healthy heartbeats, the
// backoff). Tasks in flight finish, so the hour's traffic can pass the cap by theirs.
//
// # Memory share
//
// max_memory_share caps the memory a node gives to mesh work (the models it holds whole for
// peers, the layer ranges and KV caches of the pipeline stages it runs), in percent of the
// memory available when the node starts. The node's budget is the smaller of that share and
// its own setting (--memory-budget, else its default share), recomputed whenever the
// effective policy changes (the owner's consent is re-read) and announced as ram.budget_mb,
// so the mesh plans pipelines within it. Both shares are of the memory available at start,
// not as it is now: a budget that shrank as the node loaded its own stages would unload
// them in turn. A lowered budget unloads the ranges no session uses at once and the others
// as their sessions end (inference/synth: Stage memory). It is a limit, not a breach: it
// never pauses the node.
//
// # Admission
//
// A task from a peer is admitted when the Governor is accepting, the traffic cap is not
// reached (OverCap), and then RateLimiter.Allow(peer, effective.MaxTasksPerMin, now) agrees;
// in that order, so a refused task does not use up the rate. A refusal by the rate limiter is rate_limited, refused like
// a pause. The window slides: at most max_tasks_per_min admissions in any 60 s, and a
// lowered limit applies to the next task. The budget is shared fairly between the peers
// that ask (RateLimiter has the rule): a peer alone may use all of it, and while another
// peer that used less is waiting, one that used more is refused first, so one peer's flood
// keeps no other peer out for longer than until one of its admissions ages out.
package participation
