//! The verdict on one old claim: its owner alive, on another server, or dead.

use super::*;

/// What the reaper makes of one old claim.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    Alive,
    /// Claimed through another server that is alive: its processlist is not ours to read.
    Foreign,
    /// The owner is gone; the text says why.
    Dead(String),
}

/// What one pass knows to judge claims by.
pub(super) struct View<'a> {
    /// The server this reaper is connected to.
    pub(super) me: &'a ServerId,
    /// Its processlist.
    pub(super) live: HashSet<u64>,
    /// Every server's last stamp, and its age.
    pub(super) heartbeats: Vec<(ServerId, Duration)>,
    /// On a Galera node: the member ids of its cluster.
    pub(super) members: Option<HashSet<String>>,
    /// A server without a stamp for this long is gone.
    pub(super) stale: Duration,
    /// The reaper has been connected for `stale_after`: owners of claims made elsewhere have
    /// had that long to reconnect and re-own them.
    pub(super) settled: bool,
    /// How long the reaper has reached this server's life.
    pub(super) connected_for: Duration,
    /// A Galera member nobody stamps is gone only after this long: see [`judge`].
    pub(super) member_silence: Duration,
}

pub(super) fn judge(claim: &OldClaim, view: &View) -> Verdict {
    let me = view.me;
    let Some(owner) = claim.owner_server.as_deref().and_then(ServerId::parse) else {
        return Verdict::Dead("its claim names no owner".into());
    };
    if owner.same_life(me) {
        return match claim.owner_conn {
            Some(id) if view.live.contains(&id) => Verdict::Alive,
            Some(id) => Verdict::Dead(format!("its claimer's connection {id} is gone")),
            None => Verdict::Dead("its claim names no connection".into()),
        };
    }
    // Made through another server, or an earlier start of this one: alive while it stamps its
    // heartbeat. Every instance's reaper stamps the server it reaches, and its consumer the
    // one it claims through. A Galera node that has left gets the same grace as any server,
    // so that instances may reconnect when it comes back quickly. A member nobody stamps may
    // hold an instance that is only stalled (stopped, swapping), whose connection, listed
    // there and invisible from here, keeps its claims alive: it is gone once the member has
    // been silent for longer than a consumer's session wait_timeout, after which the member
    // itself has dropped every silent consumer's connection.
    let age = view
        .heartbeats
        .iter()
        .filter(|(s, _)| s.same_life(&owner))
        .map(|(_, age)| *age)
        .min();
    let member = match (&owner.galera, &view.members) {
        (Some(uuid), Some(members)) => members.contains(uuid),
        _ => false,
    };
    let alive = match (member, age) {
        (false, Some(age)) => age < view.stale,
        (false, None) => false,
        (true, Some(age)) => age < view.member_silence,
        (true, None) => view.connected_for < view.member_silence,
    };
    let left = match (&owner.galera, &view.members) {
        (Some(_), Some(_)) if !member => "its Galera node has left the cluster and ",
        _ => "",
    };
    let silence = if member {
        view.member_silence
    } else {
        view.stale
    };
    let gone = format!(
        "{left}its server {owner} has had no heartbeat for {} ({me} now)",
        humantime::format_duration(silence)
    );
    if alive {
        Verdict::Foreign
    } else if !view.settled {
        Verdict::Alive
    } else {
        Verdict::Dead(gone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(owner_server: Option<&str>, owner_conn: Option<u64>) -> OldClaim {
        OldClaim {
            id: JobId::new(1),
            batch_id: Some(BatchId::new(9)),
            owner_conn,
            owner_server: owner_server.map(str::to_owned),
            attempts: 1,
            rescues: 0,
            suspicion: 0,
            worker: None,
            queue: "q".into(),
        }
    }

    fn server(s: &str) -> ServerId {
        ServerId::parse(s).unwrap()
    }

    fn view<'a>(me: &'a ServerId, settled: bool) -> View<'a> {
        View {
            me,
            live: [5].into(),
            heartbeats: vec![
                (server("other:3306/1000"), Duration::from_secs(1)),
                (server("old:3306/1000"), Duration::from_secs(60)),
            ],
            members: None,
            stale: Duration::from_secs(6),
            settled,
            connected_for: Duration::from_secs(if settled { 600 } else { 1 }),
            member_silence: Duration::from_secs(120),
        }
    }

    #[test]
    fn judges_owners_by_server_life_and_processlist() {
        let me = server("db:3306/1000");
        let v = view(&me, true);
        let judge_it =
            |owner: Option<&str>, conn: Option<u64>, v: &View| judge(&claim(owner, conn), v);
        assert_eq!(judge_it(Some("db:3306/1000"), Some(5), &v), Verdict::Alive);
        assert!(matches!(
            judge_it(Some("db:3306/1001"), Some(6), &v),
            Verdict::Dead(_)
        ));
        // An id that is live now but was issued by the server's previous life.
        assert!(matches!(
            judge_it(Some("db:3306/400"), Some(5), &v),
            Verdict::Dead(_)
        ));
        // Before the reaper has been connected for stale_after, owners of claims made
        // elsewhere may still be reconnecting.
        let fresh = view(&me, false);
        assert_eq!(
            judge_it(Some("db:3306/400"), Some(5), &fresh),
            Verdict::Alive
        );
        assert_eq!(
            judge_it(Some("gone:3306/1000"), Some(5), &fresh),
            Verdict::Alive
        );
        // Another server: alive while it has a recent heartbeat, gone after.
        assert_eq!(
            judge_it(Some("other:3306/1000"), Some(6), &v),
            Verdict::Foreign
        );
        assert!(matches!(
            judge_it(Some("old:3306/1000"), Some(6), &v),
            Verdict::Dead(_)
        ));
        assert!(matches!(
            judge_it(Some("gone:3306/1000"), Some(6), &v),
            Verdict::Dead(_)
        ));
        assert!(matches!(judge_it(None, None, &v), Verdict::Dead(_)));
    }

    #[test]
    fn galera_nodes_are_judged_by_the_member_list() {
        let me = server("db:3311/1000/galera:aaa");
        let mut v = view(&me, true);
        v.members = Some(["aaa".to_owned(), "bbb".to_owned()].into());
        let c = |owner: &str| claim(Some(owner), Some(9));
        // A node that left is gone once its heartbeat is stale (6 s here).
        let Verdict::Dead(why) = judge(&c("db:3313/1000/galera:ccc"), &v) else {
            panic!("a node that left the cluster holds its claims")
        };
        assert!(why.contains("left the cluster"), "{why}");
        // A member nobody stamps may hold a stalled instance: alive until it has been silent
        // for longer than a consumer's session wait_timeout (120 s here), then gone.
        v.heartbeats
            .push((server("db:3312/1000/galera:bbb"), Duration::from_secs(60)));
        assert_eq!(judge(&c("db:3312/1000/galera:bbb"), &v), Verdict::Foreign);
        v.heartbeats[2].1 = Duration::from_secs(121);
        let Verdict::Dead(why) = judge(&c("db:3312/1000/galera:bbb"), &v) else {
            panic!("a member nobody stamps holds its claims")
        };
        assert!(
            !why.contains("left the cluster") && why.contains("2m"),
            "{why}"
        );
        // Never stamped: judged by how long this reaper has been there to see it.
        let never = c("db:3312/1000/galera:ddd");
        v.members = Some(["aaa".to_owned(), "ddd".to_owned()].into());
        assert!(matches!(judge(&never, &v), Verdict::Dead(_)));
        v.connected_for = Duration::from_secs(30);
        assert_eq!(judge(&never, &v), Verdict::Foreign);
        // Stamped lately, a node that left is alive too; without the member list (no SELECT
        // on it), the heartbeats decide as for any server.
        v.heartbeats
            .push((server("db:3313/1000/galera:ccc"), Duration::from_secs(2)));
        assert_eq!(judge(&c("db:3313/1000/galera:ccc"), &v), Verdict::Foreign);
        v.members = None;
        assert!(matches!(
            judge(&c("db:3312/1000/galera:bbb"), &v),
            Verdict::Dead(_)
        ));
    }
}
