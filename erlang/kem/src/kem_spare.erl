%%% @doc Warm spares: Python ports opened, handshaken and warmed ahead of
%%% need, handed to a port owner that restarts (docs/reliability.md).
%%%
%%% Opening a port means starting Python, opening a GPU device and
%%% compiling: 0.6-0.9 s on lavapipe, 1.4-6.3 s on an H100 (issue 18). A
%%% restarting `kem_port' owner instead takes a spare's already-open Erlang
%%% port (`erlang:port_connect/2' + `unlink/1', in `take/1'), and this server
%%% prepares the next spare in the background. While idle, a spare's
%%% Python process blocks on its pipe: no GPU work, no CPU.
%%%
%%% This server also keeps the group's list of recently served kernel
%%% shapes (`kem_warm'): a new spare is warmed with it, an idle spare gets
%%% each new shape as it is reported (a cheap `warm' call), and a port that
%%% opens without a spare warms itself with it (`shapes/0').
%%%
%%% Callers that find no port registered (`noproc') while a spare is about
%%% to take over wait here (`await/2') for the name to come back.
%%%
%%% One server keeps the spares of every port group (kem_place: one group
%%% per adapter): `spares' spares per group, each opened with its group's
%%% environment (its `KEM_ADAPTER') and taken only by a port of that group.
%%% The warm list is the node's: a kernel served by one group may spill to
%%% another (kem_place), so every group's spares compile it.
%%%
%%% It never calls a port owner, so owners may call it from `init'.
-module(kem_spare).
-behaviour(gen_server).

-export([start_link/2, take/2, await/3, up/1, served/1, shapes/0, info/0, count/0]).
-export([init/1, handle_call/3, handle_cast/2, handle_info/2, terminate/2]).

-define(SERVER, ?MODULE).
-define(RETRY_MS, 1000).  % after a spare failed to start

%% @doc ShmDir: the node's shared-memory directory, as each port owner gets it.
%% Groups: each port group's number and environment (kem_place:group_envs/0);
%% a group's spares are opened with its environment and taken only by its
%% ports (kem_sup).
-spec start_link(string() | undefined, [{pos_integer(), [{string(), string()}]}]) ->
    {ok, pid()} | {error, term()}.
start_link(ShmDir, Groups) ->
    gen_server:start_link({local, ?SERVER}, ?MODULE, {ShmDir, Groups}, []).

%% @doc For port owner Name, restarting: take a spare of its group (the
%% calling process becomes the owner of its open port), or `none' (no
%% spare: open a new one). Env is the owner's environment, which must be
%% its group's. Waits for a spare that is starting, at most `start_timeout'.
-spec take(atom(), [{string(), string()}]) ->
    {ok, #{port := port(), os_pid := integer() | undefined, next := pos_integer()}} | none.
take(Name, Env) ->
    case whereis(?SERVER) of
        undefined -> none;
        Pid ->
            try gen_server:call(Pid, {take, Name, Env}, start_timeout() + 1000)
            catch exit:_ -> none
            end
    end.

%% @doc Wait up to Ms for an owner other than Old to hold name Name: `ok',
%% or `unavailable' at once when no spare is there to take over, or
%% `timeout'.
-spec await(atom() | pid(), pid() | undefined, timeout()) -> ok | unavailable | timeout.
await(Name, Old, Ms) when is_atom(Name), is_integer(Ms), Ms > 0 ->
    case whereis(?SERVER) of
        undefined -> unavailable;
        Pid ->
            try gen_server:call(Pid, {await, Name, Old, Ms}, Ms + 1000)
            catch exit:_ -> unavailable
            end
    end;
await(_Name, _Old, _Ms) ->
    unavailable.

%% @doc Port owner Name is up (it opened its own port): release its waiters.
-spec up(atom()) -> ok.
up(Name) ->
    gen_server:cast(?SERVER, {up, Name}).

%% @doc A port owner served a call of this shape for the first time.
-spec served(kem_warm:shape()) -> ok.
served(Shape) ->
    gen_server:cast(?SERVER, {served, Shape}).

%% @doc The group's recently served kernel shapes (newest first).
-spec shapes() -> [kem_warm:shape()].
shapes() ->
    case whereis(?SERVER) of
        undefined -> [];
        Pid ->
            try gen_server:call(Pid, shapes, 5000)
            catch exit:_ -> []
            end
    end.

%% @doc The spares: group, OS pid, stage and resident memory (KiB, from
%% /proc; `undefined' where there is none) of each, for figures and health.
-spec info() -> [#{group := pos_integer(), os_pid := integer() | undefined, stage := atom(),
                   rss_kib := integer() | undefined}].
info() ->
    gen_server:call(?SERVER, info).

%% @doc How many spares to keep per port group (app env `spares'; 0 = off).
-spec count() -> non_neg_integer().
count() ->
    case application:get_env(kem, spares, 1) of
        N when is_integer(N), N >= 0 -> N;
        Other -> error({bad_config, {spares, Other}})
    end.

%%% gen_server

init({ShmDir, Groups}) ->
    process_flag(trap_exit, true),
    State = #{shm_dir => ShmDir, groups => maps:from_list(Groups), want => count(), spares => [],
              takers => [], waiters => [], shapes => [], limit => kem_warm:limit()},
    {ok, fill(State)}.

handle_call({take, Name, Env}, From, State = #{groups := Groups}) ->
    %% Only a port of a group this server keeps spares for, started with
    %% that group's environment (a port opened otherwise opens its own).
    G = kem_place:group_of(Name),
    case maps:find(G, Groups) of
        {ok, Env} -> take_spare(Name, G, From, State);
        _ -> {reply, none, State}
    end;
handle_call({await, Name, Old, Ms}, From, State = #{want := Want, waiters := Waiters}) ->
    case whereis(Name) of
        Pid when is_pid(Pid), Pid =/= Old -> {reply, ok, State};
        _ when Want =:= 0 -> {reply, unavailable, State};  % no spare: a restart takes seconds
        _ ->
            TRef = erlang:send_after(Ms, self(), {await_timeout, From}),
            {noreply, State#{waiters := [{Name, From, TRef} | Waiters]}}
    end;
handle_call(shapes, _From, State = #{shapes := Shapes}) ->
    {reply, Shapes, State};
handle_call(info, _From, State = #{spares := Spares}) ->
    {reply, [#{group => G, os_pid => P, stage => S, rss_kib => rss_kib(P)}
             || #{group := G, os_pid := P, stage := S} <- Spares], State}.

handle_cast({up, Name}, State) ->
    {noreply, release_waiters(Name, State)};
handle_cast({served, Shape}, State = #{shapes := Shapes, limit := Limit}) ->
    case kem_warm:add(Shape, Shapes, Limit) of
        {known, _} -> {noreply, State};
        {new, Updated} -> {noreply, refresh(Shape, State#{shapes := Updated})}
    end.

handle_info({Port, {data, Frame}}, State) when is_port(Port) ->
    case find(Port, State) of
        {ok, Spare} -> {noreply, on_reply(decode(Frame), Spare, State)};
        error -> {noreply, State}  % a reply for a spare already handed over
    end;
handle_info({Port, eof}, State) when is_port(Port) ->
    spare_failed(Port, exited, State);  % its stdout closed: it is dying (kem_port)
handle_info({spare_timeout, Port}, State) ->
    spare_failed(Port, start_timeout, State);
handle_info({'EXIT', Port, Reason}, State) when is_port(Port) ->
    spare_failed(Port, Reason, State);
handle_info({await_timeout, From}, State = #{waiters := Waiters}) ->
    case lists:keytake(From, 2, Waiters) of
        {value, _, Rest} ->
            gen_server:reply(From, timeout),
            {noreply, State#{waiters := Rest}};
        false ->
            {noreply, State}
    end;
handle_info(fill, State) ->
    {noreply, fill(State)};
handle_info(_Other, State) ->
    {noreply, State}.

terminate(_Reason, #{spares := Spares}) ->
    [kem_port:close_port(P, OsPid, later) || #{port := P, os_pid := OsPid} <- Spares],
    ok.

%%% taking a spare

take_spare(Name, G, From, State = #{spares := Spares, takers := Takers}) ->
    case best(G, Spares) of
        {ok, Spare} -> {noreply, hand_over(Spare, Name, From, State)};
        starting -> {noreply, fill(State#{takers := Takers ++ [{Name, G, From}]})};
        none -> {reply, none, State}
    end.

%% A ready spare first, then one still compiling its warm list (its first
%% calls queue behind the compile, no later than a fresh port's would).
best(G, All) ->
    Spares = [S || S = #{group := G1} <- All, G1 =:= G],
    case [S || S = #{stage := ready} <- Spares] ++ [S || S = #{stage := warming} <- Spares] of
        [Spare | _] -> {ok, Spare};
        [] when Spares =/= [] -> starting;
        [] -> none
    end.

hand_over(Spare = #{port := Port, os_pid := OsPid, next := Next, group := G}, Name, From = {Pid, _}, State) ->
    Rest = remove(Port, State),
    cancel(maps:get(tref, Spare, undefined)),
    try
        %% A spare whose stdout closed is dying, though its port is open
        %% (`eof'): never hand that over.
        alive = receive {Port, eof} -> error(badarg) after 0 -> alive end,
        true = erlang:port_connect(Port, Pid),
        true = unlink(Port),
        gen_server:reply(From, {ok, #{port => Port, os_pid => OsPid, next => Next}}),
        fill(release_waiters(Name, Rest))
    catch
        error:badarg ->
            %% The spare died under us or the taker is gone: try the next.
            kem_port:close_port(Port, OsPid, now),
            self() ! fill,
            case take_spare(Name, G, From, Rest) of
                {reply, Reply, Next2} -> gen_server:reply(From, Reply), Next2;
                {noreply, Next2} -> Next2
            end
    end.

serve_takers(State = #{takers := []}) ->
    State;
serve_takers(State = #{takers := Takers}) ->
    serve_takers(Takers, State#{takers := []}).

%% Each waiting restart in turn, from its own group's spares; one whose
%% group has only spares still starting waits on.
serve_takers([], State) ->
    State;
serve_takers([Taker = {Name, G, From} | Rest], State = #{spares := Spares, takers := Waiting}) ->
    case best(G, Spares) of
        {ok, Spare} -> serve_takers(Rest, hand_over(Spare, Name, From, State));
        starting -> serve_takers(Rest, State#{takers := Waiting ++ [Taker]});
        none -> gen_server:reply(From, none), serve_takers(Rest, State)
    end.

release_waiters(Name, State = #{waiters := Waiters}) ->
    {Mine, Others} = lists:partition(fun({N, _, _}) -> N =:= Name end, Waiters),
    [begin cancel(TRef), gen_server:reply(From, ok) end || {_, From, TRef} <- Mine],
    State#{waiters := Others}.

%%% preparing spares

%% Keep `want' spares per group, plus one more for each restart of that
%% group already waiting (several ports killed at once each get theirs,
%% started side by side).
fill(State = #{groups := Groups}) ->
    lists:foldl(fun fill/2, State, lists:sort(maps:keys(Groups))).

fill(G, State = #{want := Want, spares := Spares, takers := Takers}) ->
    Have = length([x || #{group := G1} <- Spares, G1 =:= G]),
    case Have >= Want + length([x || {_, G1, _} <- Takers, G1 =:= G]) of
        true -> State;
        false -> start_spare(G, State)
    end.

start_spare(G, State = #{spares := Spares, shm_dir := ShmDir, groups := Groups}) ->
    case kem_port:open_port_process(ShmDir, maps:get(G, Groups)) of
        {ok, Port, OsPid} ->
            %% The owner's handshake (kem_port): ping, then version, ReqId 0.
            true = port_command(Port, term_to_binary({call, 0, ping, {}})),
            true = port_command(Port, term_to_binary({call, 0, version, {}})),
            TRef = erlang:send_after(start_timeout(), self(), {spare_timeout, Port}),
            Spare = #{port => Port, os_pid => OsPid, next => 1, stage => starting, tref => TRef, group => G},
            fill(G, State#{spares := Spares ++ [Spare]});
        {error, Reason} ->
            logger:warning("kem_spare: cannot start a spare port: ~0p; retrying in ~b ms", [Reason, ?RETRY_MS]),
            erlang:send_after(?RETRY_MS, self(), fill),
            State
    end.

on_reply({reply, 0, {ok, pong}}, Spare = #{stage := starting}, State) ->
    store(Spare#{stage := checking}, State);
on_reply({reply, 0, Version}, Spare = #{stage := checking, port := Port}, State = #{shapes := Shapes}) ->
    case kem_version:check(Version) of
        ok ->
            cancel(maps:get(tref, Spare)),
            serve_takers(warm(Shapes, maps:remove(tref, Spare), State));
        {error, Reason} ->
            {noreply, Next} = spare_failed(Port, Reason, State),
            Next
    end;
on_reply({reply, Id, Result}, Spare = #{stage := warming, warm_id := Id}, State) ->
    case Result of
        {ok, _Counts} -> ok;
        Error -> logger:warning("kem_spare: warm failed: ~0P", [Error, 8])
    end,
    serve_takers(store(Spare#{stage := ready}, State));
on_reply(Other, _Spare, State) ->
    %% A log frame of the spare's Python goes to logger like a port's.
    _ = kem_log:frame(kem_spare, Other),
    State.

%% Send the spare a warm call; it is `warming' until the last one answers.
warm(Shapes, Spare = #{port := Port, next := Id}, State) ->
    true = port_command(Port, term_to_binary({call, Id, warm, {Shapes}})),
    store(Spare#{stage := warming, warm_id => Id, next := Id + 1}, State).

%% A new shape: idle and warming spares compile it now, starting ones get
%% the whole list after their handshake.
refresh(Shape, State = #{spares := Spares}) ->
    lists:foldl(fun(#{stage := starting}, S) -> S;
                   (#{stage := checking}, S) -> S;
                   (Spare, S) -> warm([Shape], Spare, S)
                end, State, Spares).

spare_failed(Port, Why, State) ->
    case find(Port, State) of
        {ok, #{os_pid := OsPid} = Spare} ->
            logger:warning("kem_spare: spare port ~p failed (~0p); starting another in ~b ms",
                           [OsPid, Why, ?RETRY_MS]),
            cancel(maps:get(tref, Spare, undefined)),
            kem_port:close_port(Port, OsPid, now),
            erlang:send_after(?RETRY_MS, self(), fill),
            {noreply, serve_takers(remove(Port, State))};
        error ->
            {noreply, State}
    end.

%%% internals

find(Port, #{spares := Spares}) ->
    case [S || S = #{port := P} <- Spares, P =:= Port] of
        [Spare] -> {ok, Spare};
        [] -> error
    end.

store(Spare = #{port := Port}, State = #{spares := Spares}) ->
    State#{spares := [case S of #{port := Port} -> Spare; _ -> S end || S <- Spares]}.

remove(Port, State = #{spares := Spares}) ->
    State#{spares := [S || S = #{port := P} <- Spares, P =/= Port]}.

decode(Frame) ->
    try binary_to_term(Frame)
    catch error:badarg -> bad_frame
    end.

cancel(undefined) -> ok;
cancel(TRef) -> erlang:cancel_timer(TRef, [{async, true}, {info, false}]).

rss_kib(undefined) -> undefined;
rss_kib(OsPid) ->
    case file:read_file("/proc/" ++ integer_to_list(OsPid) ++ "/status") of
        {ok, Status} ->
            case re:run(Status, "VmRSS:\\s+(\\d+)", [{capture, all_but_first, binary}]) of
                {match, [Kib]} -> binary_to_integer(Kib);
                nomatch -> undefined
            end;
        {error, _} -> undefined
    end.

start_timeout() ->
    application:get_env(kem, start_timeout, 60000).
