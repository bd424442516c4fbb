%%% @doc kem across Erlang nodes: nodes with GPUs serve, GPU-less nodes
%%% forward (docs/cluster.md).
%%%
%%% Membership is OTP `pg' (scope `kem'): every node's `kem_cluster' joins
%%% `members'; a node with live local ports also joins `serving'. Each
%%% serving node broadcasts its capacity (live ports) and load (calls in
%%% progress) to all members every ?TICK_MS; forwarders keep the figures in
%%% ETS and pick the serving node with the most free capacity.
%%%
%%% A forwarded call is one `erlang:spawn_request/5' of `serve/3' on the
%%% chosen node: the payload crosses the distribution link as a binary
%%% (never /dev/shm), the remote process runs the call on its node's ports
%%% (kernel fetches happen there) and exits with the reply. The monitor
%%% tells the caller at once when the node or the process goes away before
%%% answering; the call is then retried ONCE on another node, within the
%%% same deadline. Kernel calls are pure (the output is a function of the
%%% kernel, input and params; a run leaves nothing behind but caches), so
%%% running one again after the first node may have started it is safe.
-module(kem_cluster).
-behaviour(gen_server).

-export([children/0, start_link/0, local_gpus/0, forward/3, fallback/4,
         serve/3, stats/0, serving_nodes/0]).
-export([init/1, handle_call/3, handle_cast/2, handle_info/2]).

-define(SCOPE, kem).
-define(SERVING, serving).
-define(MEMBERS, members).
-define(CAPACITY, kem_cluster_capacity).
-define(TICK_MS, 200).
%% A capacity report older than this is ignored (its node missed 5 ticks).
-define(STALE_MS, 1000).
%% Calls one port keeps in flight before a node counts as full: the port's
%% queue batches them (docs/executor.md), so a few dozen per port is normal.
-define(SLOTS_PER_PORT, 32).
%% Reported load this small is noise to the pick (see pick/1).
-define(REPORT_SLACK, 4).
%% The caller waits this long past the deadline for the remote's own
%% timeout reply, as kem_port does for its owner.
-define(MARGIN_MS, 1000).
%% How long after start a call with no serving node in sight waits for one
%% (pg and the connections of a cluster that starts at once), and how often
%% it looks.
-define(SETTLE_MS, 5000).
-define(POLL_MS, 50).

-type served() :: {{ok, term()} | {error, kem_port:reason()}, node()}.

%% @doc The supervisor children: the `pg' scope, then this server. They go
%% after the ports, so a node joins `serving' only with ports that answer.
-spec children() -> [supervisor:child_spec()].
children() ->
    [#{id => kem_pg, start => {pg, start_link, [?SCOPE]}, type => worker},
     #{id => ?MODULE, start => {?MODULE, start_link, []}, type => worker}].

-spec start_link() -> {ok, pid()} | {error, term()}.
start_link() ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, [], []).

%% @doc Does this node run kernels itself? App env `local_gpus' (default
%% true) or `adapters => none' make a front node that forwards every call.
-spec local_gpus() -> boolean().
local_gpus() ->
    application:get_env(kem, local_gpus, true) =/= false
        andalso application:get_env(kem, adapters, auto) =/= none.

%% @doc Run Method/Args on another serving node of the cluster, within
%% Timeout ms; the second element is the node that answered.
-spec forward(atom(), tuple(), timeout()) -> served().
forward(Method, Args, Timeout) ->
    case whereis(?MODULE) of
        undefined -> {{error, {not_started, <<"application kem is not running">>}}, node()};
        _ -> forward(Method, Args, deadline(Timeout), [], 1)
    end.

%% @doc A local call failed with Reply because no local port could take it:
%% forward it when another node serves, else keep Reply.
-spec fallback(atom(), tuple(), timeout(), {error, kem_port:reason()}) -> served().
fallback(Method, Args, Timeout, Reply) ->
    case serving_nodes() of
        [] -> {Reply, node()};
        _ -> forward(Method, Args, Timeout)
    end.

%% @doc Runs on the serving node, in a process the caller monitors; the
%% reply travels as its exit reason.
-spec serve(atom(), tuple(), timeout()) -> no_return().
serve(Method, Args, Timeout) ->
    Reply = case whereis(?MODULE) =/= undefined andalso local_gpus() of
        true -> kem:call_local(Method, Args, Timeout);
        false -> not_serving
    end,
    exit({?MODULE, Reply}).

%% @doc The other nodes that serve now.
-spec serving_nodes() -> [node()].
serving_nodes() ->
    try lists:usort([node(P) || P <- pg:get_members(?SCOPE, ?SERVING), node(P) =/= node()])
    catch error:badarg -> []
    end.

%% @doc Per remote node: calls, errors, retries, pending and total latency
%% (µs) of the calls this node forwarded; and the capacity each serving
%% node last reported.
-spec stats() -> #{node() => map()}.
stats() ->
    kem_cluster_stats:by_node(reports()).

%%% forwarding

forward(Method, Args, Deadline, Tried, Retries) ->
    case pick_settled(Tried, Deadline) of
        none ->
            {{error, {no_kem_node, no_node_detail(Tried)}}, node()};
        {ok, Node} ->
            Start = erlang:monotonic_time(microsecond),
            kem_cluster_stats:started(Node),
            Outcome = run_on(Node, Method, Args, Deadline),
            kem_cluster_stats:finished(Node, Outcome, erlang:monotonic_time(microsecond) - Start),
            case Outcome of
                {reply, Reply} -> {Reply, Node};
                {gone, _Why} when Retries > 0 ->
                    kem_cluster_stats:retried(Node),
                    forward(Method, Args, Deadline, [Node | Tried], Retries - 1);
                {gone, _Why} ->
                    {{error, {no_kem_node, <<"the kem nodes tried went away before answering">>}}, Node}
            end
    end.

run_on(Node, Method, Args, Deadline) ->
    Left = left(Deadline),
    %% As erpc does: the reply is the remote process's exit reason, so a
    %% call is one message each way (no spawn_reply unless the spawn fails).
    %% spawn_request, not spawn_monitor/4: a failed spawn_monitor/4 logs its
    %% arguments, the whole payload; a failed request is just a message.
    Ref = erlang:spawn_request(Node, ?MODULE, serve, [Method, Args, Left],
                               [monitor, {reply, error_only}]),
    Wait = case Left of infinity -> infinity; _ -> Left + ?MARGIN_MS end,
    receive
        {'DOWN', Ref, process, _, {?MODULE, not_serving}} ->
            {gone, not_serving};
        {'DOWN', Ref, process, _, {?MODULE, {error, {not_started, _}}}} ->
            %% The remote app is stopping: it never ran the kernel.
            {gone, not_started};
        {'DOWN', Ref, process, _, {?MODULE, Reply}} ->
            {reply, Reply};
        {'DOWN', Ref, process, _, Why} ->
            {gone, Why};
        {spawn_reply, Ref, error, Why} ->
            {gone, Why}
    after Wait ->
        %% The remote's own timeout ends its process; forget it here.
        _ = erlang:spawn_request_abandon(Ref),
        erlang:demonitor(Ref, [flush]),
        timed_out()
    end.

timed_out() ->
    {reply, {error, {timeout, <<"the kem node did not answer in time">>}}}.

%% Just after start pg has not heard from the other nodes yet (it learns
%% members asynchronously once a node connects): a call then waits for a
%% serving node, at most until ?SETTLE_MS after start or its deadline.
pick_settled(Tried, Deadline) ->
    case pick(Tried) of
        none ->
            Now = erlang:monotonic_time(millisecond),
            Started = persistent_term:get({?MODULE, started}, Now - ?SETTLE_MS),
            case Now < Started + ?SETTLE_MS andalso (Deadline =:= infinity orelse Now < Deadline) of
                true -> timer:sleep(?POLL_MS), pick_settled(Tried, Deadline);
                false -> none
            end;
        Found ->
            Found
    end.

%% The serving node not yet tried with the most free slots: its capacity
%% less our calls in flight there (exact) and the load others put on it
%% (its last report less ours, less ?REPORT_SLACK: a report is up to
%% ?TICK_MS old and counts calls of ours that have ended since). Ties go to
%% the node this node prefers (a hash of both names), so a light load stays
%% on one node and different front nodes prefer different ones. Measured
%% (docs/cluster.md): a sequential caller spread at random over two nodes
%% paid 484-589 us a call, kept on one 334-399 us, as each node's
%% schedulers sleep between calls that alternate.
pick(Tried) ->
    Now = erlang:monotonic_time(millisecond),
    Reports = reports(),
    Scored = [{free(Node, Reports, Now), erlang:phash2({node(), Node}), Node}
              || Node <- serving_nodes(), not lists:member(Node, Tried)],
    case Scored of
        [] -> none;
        _ -> {ok, element(3, lists:max(Scored))}
    end.

free(Node, Reports, Now) ->
    Ours = kem_cluster_stats:pending(Node),
    case maps:get(Node, Reports, undefined) of
        #{ports := Ports, load := Load, at := At} when Now - At =< ?STALE_MS ->
            Ports * ?SLOTS_PER_PORT - Ours - max(0, Load - Ours - ?REPORT_SLACK);
        _ ->
            ?SLOTS_PER_PORT - Ours
    end.

no_node_detail([]) -> <<"no kem node with a GPU is reachable in this cluster">>;
no_node_detail(_) -> <<"no other kem node could take the call">>.

deadline(infinity) -> infinity;
deadline(Ms) -> erlang:monotonic_time(millisecond) + Ms.

left(infinity) -> infinity;
left(Deadline) -> max(0, Deadline - erlang:monotonic_time(millisecond)).

reports() ->
    try maps:from_list([{Node, R} || {Node, R} <- ets:tab2list(?CAPACITY)])
    catch error:badarg -> #{}
    end.

%%% gen_server: membership and capacity reports

init([]) ->
    _ = ets:new(?CAPACITY, [named_table, public, set, {read_concurrency, true}]),
    ok = kem_cluster_stats:init(),
    persistent_term:put({?MODULE, started}, erlang:monotonic_time(millisecond)),
    ok = pg:join(?SCOPE, ?MEMBERS, self()),
    self() ! tick,
    {ok, #{serving => false}}.

handle_call(_Msg, _From, State) -> {reply, ok, State}.
handle_cast(_Msg, State) -> {noreply, State}.

handle_info(tick, State) ->
    connect_configured(),
    NewState = serve_if_able(State),
    report(NewState),
    erlang:send_after(?TICK_MS, self(), tick),
    {noreply, NewState};
handle_info({kem_capacity, Node, Ports, Load}, State) ->
    true = ets:insert(?CAPACITY, {Node, #{ports => Ports, load => Load,
                                          at => erlang:monotonic_time(millisecond)}}),
    {noreply, State};
handle_info(_Msg, State) ->
    {noreply, State}.

%% In `serving' while the node has local GPUs and at least one live port;
%% out when all its ports are down (a forwarder then stops picking it).
serve_if_able(State = #{serving := Serving}) ->
    Able = local_gpus() andalso live_ports() > 0,
    case {Able, Serving} of
        {true, false} -> ok = pg:join(?SCOPE, ?SERVING, self());
        {false, true} -> ok = pg:leave(?SCOPE, ?SERVING, self());
        _ -> ok
    end,
    State#{serving := Able}.

report(#{serving := false}) ->
    ok;
report(#{serving := true}) ->
    Msg = {kem_capacity, node(), live_ports(), kem_place:pending()},
    [P ! Msg || P <- pg:get_members(?SCOPE, ?MEMBERS), node(P) =/= node()],
    ok.

live_ports() ->
    case persistent_term:get({kem, ports}, undefined) of
        undefined -> 0;
        {Names, _} -> length([N || N <- tuple_to_list(Names), whereis(N) =/= undefined])
    end.

%% App env `cluster_nodes': nodes to stay connected to (pg finds the kem
%% nodes among connected ones). Already connected nodes cost nothing.
connect_configured() ->
    Connected = nodes(),
    case [N || N <- application:get_env(kem, cluster_nodes, []),
               N =/= node(), not lists:member(N, Connected)] of
        [] -> ok;
        %% Off this process: connecting to a node that is down takes seconds.
        Missing -> _ = spawn(fun() -> [net_kernel:connect_node(N) || N <- Missing] end), ok
    end.
