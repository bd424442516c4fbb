%%% @doc Counters of forwarded calls, per remote node (ETS, bumped by the
%%% calling process, so counting costs no message): calls, errors, retries,
%%% calls pending now and their summed latency in µs.
-module(kem_cluster_stats).
-export([init/0, started/1, finished/3, retried/1, pending/1, by_node/1]).

-define(TABLE, kem_cluster_stats).

%% @doc Create the table; called by kem_cluster, which owns it.
-spec init() -> ok.
init() ->
    _ = ets:new(?TABLE, [named_table, public, set, {write_concurrency, true}]),
    ok.

-spec started(node()) -> ok.
started(Node) ->
    bump({Node, pending}, 1).

%% @doc A forwarded call ended: with a reply (an error reply counts as an
%% error) or with its node gone.
-spec finished(node(), {reply, term()} | {gone, term()}, non_neg_integer()) -> ok.
finished(Node, Outcome, Us) ->
    bump({Node, pending}, -1),
    bump({Node, calls}, 1),
    bump({Node, latency_us}, Us),
    case Outcome of
        {reply, {ok, _}} -> ok;
        {reply, _} -> bump({Node, errors}, 1);
        {gone, _} -> bump({Node, gone}, 1)
    end.

-spec retried(node()) -> ok.
retried(Node) ->
    bump({Node, retries}, 1).

%% @doc Calls this node has in flight on Node now.
-spec pending(node()) -> integer().
pending(Node) ->
    try ets:lookup_element(?TABLE, {Node, pending}, 2)
    catch error:badarg -> 0
    end.

%% @doc One map per node seen, merged with the capacity reports.
-spec by_node(#{node() => map()}) -> #{node() => map()}.
by_node(Reports) ->
    Rows = try ets:tab2list(?TABLE) catch error:badarg -> [] end,
    Zero = #{calls => 0, errors => 0, gone => 0, retries => 0, pending => 0, latency_us => 0},
    Counted = lists:foldl(fun({{Node, Key}, V}, Acc) ->
                                  maps:update_with(Node, fun(M) -> M#{Key => V} end, Zero#{Key => V}, Acc)
                          end, #{}, Rows),
    maps:fold(fun(Node, R, Acc) ->
                      maps:update_with(Node, fun(M) -> M#{reported => maps:without([at], R)} end,
                                       Zero#{reported => maps:without([at], R)}, Acc)
              end, Counted, Reports).

bump(Key, By) ->
    try ets:update_counter(?TABLE, Key, By, {Key, 0}), ok
    catch error:badarg -> ok
    end.
