%%% @doc Owner of one Python `kem_port' process: its callers, its port's
%%% messages, and what every waiting caller hears when the port dies.
%%%
%%% A thin gen_server: it frames each request as
%%% `{call, ReqId, Method, Args}', remembers `ReqId => caller' and answers
%%% the caller when `{reply, ReqId, Result}' comes back, so any number of
%%% processes call concurrently through one port and replies may arrive out
%%% of order. docs/protocol.md is the wire contract. Its parts, each in the
%%% module named after its question:
%%% - kem_port_call: the caller's side (checks, resends after a restart);
%%% - kem_port_hold: calls held while callers queue, sent as group and
%%%   calls frames (kem_group builds them);
%%% - kem_port_start: a new port's handshake, version check and warm-up;
%%% - kem_port_process: the Python process's arguments and environment,
%%%   and how it is closed and reaped.
%%%
%%% Failure handling, in one place:
%%% - the port exits: every waiting caller gets `{error, {port_exited, S}}'
%%%   at once and the server stops, so the supervisor starts a new port;
%%% - a call outlives its timeout: the caller gets `{error, {timeout, _}}'
%%%   saying what the call was waiting for. The port itself answers calls
%%%   whose deadline (sent with each call) passes while they wait for a
%%%   kernel fetch or in its queue. When the owner's timer fires first it
%%%   asks the port where the call is (`call_state', kem_timeout): only
%%%   when the GPU thread is inside that very call, or the port does not
%%%   answer within `probe_timeout' ms, is the port killed (with
%%%   `kill_on_timeout', the default), since a kernel still running would
%%%   stall every later call;
%%% - the node dies: the port's stdin closes and Python exits on EOF.
%%%
%%% A restarting owner takes a warm spare's open port (`kem_spare') instead
%%% of opening one; calls that never reached the port are answered ?RETRY
%%% and sent again by their callers to the replacement.
-module(kem_port).
-behaviour(gen_server).

-export([start_link/2, start_link/3, start_link/4, start_module/1, start_script/1, call/4, os_pid/1]).
-export([python_executable/0, open_port_process/2, close_port/3]).
-export([init/1, handle_continue/2, handle_call/3, handle_cast/2, handle_info/2, terminate/2, format_status/1]).
-export([maybe_kill/2]).

-include("kem_port.hrl").  % ?IS_TIMEOUT, ?RETRY
%% The ETF head of `{replies, Index, Blob}', matched here byte for byte
%% (kem_port/batch_frames.py writes the same; kem_group writes the heads of
%% the frames the node sends).
-define(REPLIES_HEAD, 131, 104, 3, 119, 7, "replies", 109).
-define(BINARY_EXT, 109).

-type reason() :: {atom(), term()}.
-export_type([reason/0]).

-spec start_link(atom(), pos_integer()) -> {ok, pid()} | {error, term()}.
start_link(Name, Index) ->
    start_link(Name, Index, undefined).

%% @doc ShmDir: the node's shared-memory directory (kem_shm_dir), handed in
%% by kem_sup and passed to Python as KEM_SHM_DIR; `undefined' for none.
-spec start_link(atom(), pos_integer(), string() | undefined) -> {ok, pid()} | {error, term()}.
start_link(Name, Index, ShmDir) ->
    gen_server:start_link({local, Name}, ?MODULE, {Name, Index, {module, "kem_port"}, ShmDir}, []).

%% @doc With Env on top of the settings (a port group's `KEM_ADAPTER',
%% kem_place).
-spec start_link(atom(), pos_integer(), string() | undefined, [{string(), string()}]) ->
    {ok, pid()} | {error, term()}.
start_link(Name, Index, ShmDir, Env) ->
    gen_server:start_link({local, Name}, ?MODULE, {Name, Index, {module, "kem_port"}, ShmDir, Env}, []).

%% @doc An unregistered, unsupervised owner of another Python module that
%% speaks the same protocol.
-spec start_module(string()) -> {ok, pid()} | {error, term()}.
start_module(Module) ->
    gen_server:start(?MODULE, {list_to_atom(Module), 0, {module, Module}, undefined}, []).

%% @doc The same for a Python script (the benchmark's tools/echo_port.py).
-spec start_script(string()) -> {ok, pid()} | {error, term()}.
start_script(Path) ->
    gen_server:start(?MODULE, {list_to_atom(filename:basename(Path)), 0, {script, Path}, undefined}, []).

%% @doc Send one request and wait for its reply, at most Timeout ms
%% (kem_port_call: the caller's side, resends after a restart included).
-spec call(atom() | pid(), atom(), tuple(), timeout()) ->
    {ok, term()} | {error, reason()}.
call(Server, Method, Args, Timeout) ->
    kem_port_call:call(Server, Method, Args, Timeout).

%% @doc The OS pid of the Python process behind a port owner.
-spec os_pid(atom() | pid()) -> integer().
os_pid(Server) ->
    gen_server:call(Server, os_pid).

%%% gen_server

init({Name, Index, Command, ShmDir}) ->
    init({Name, Index, Command, ShmDir, []});
init({Name, Index, Command = {module, "kem_port"}, ShmDir, Env}) ->
    process_flag(trap_exit, true),
    case whereis(kem_spare) of
        undefined ->
            %% The app's first start: open here, so a port that cannot
            %% start fails the start with its reason.
            open_fresh(Name, Index, Command, ShmDir, Env);
        _ ->
            %% A restart: return at once (the supervisor is free to restart
            %% another port meanwhile); calls queue in the mailbox until
            %% the port is taken from a spare or opened (handle_continue).
            restarting(Index, true),
            kem_spare:up(Name),  % callers waiting for the name may queue here now
            State = (new_state(Name, Index, undefined, undefined, 1))#{env => Env},
            {ok, State, {continue, {start_port, Index, ShmDir}}}
    end;
init({Name, Index, Command, ShmDir, Env}) ->
    process_flag(trap_exit, true),
    open_fresh(Name, Index, Command, ShmDir, Env).

handle_continue({start_port, Index, ShmDir}, State = #{name := Name, env := Env}) ->
    %% A spare carries the environment it was opened with (its group's
    %% adapter): only a port of that group may take it.
    case kem_spare:take(Name, Env) of
        {ok, #{port := Port, os_pid := OsPid, next := Next}} ->
            %% Already open, handshaken and warmed by kem_spare.
            kem_metrics:port_started(Name),
            restarting(Index, false),
            {noreply, State#{port := Port, os_pid := OsPid, next := Next}};
        none ->
            case open_fresh(Name, Index, {module, "kem_port"}, ShmDir, Env) of
                {ok, Opened} -> {noreply, Opened};
                {stop, Reason} -> {stop, Reason, State}
            end
    end.

%% Open a port, handshake (kem_port_start) and, for a kem port, warm it
%% before saying ready.
open_fresh(Name, Index, Command, ShmDir, Env) ->
    case kem_port_process:open(python_executable(), Command, ShmDir, Env) of
        {ok, Port} ->
            State = new_state(Name, Index, Port, kem_port_process:os_pid_of(Port), 1),
            kem_metrics:port_started(Name),
            case kem_port_start:handshake(State) of
                ok when Command =:= {module, "kem_port"} -> warm_then_up(State);
                ok -> {ok, State};
                Stop -> Stop
            end;
        {error, Reason} ->
            {stop, Reason}
    end.

%% Warm the kernels the group served last (ReqId `next'), then say ready.
warm_then_up(State = #{next := Id, name := Name, index := Index}) ->
    case kem_port_start:warm(State) of
        ok ->
            kem_spare:up(Name),
            restarting(Index, false),
            {ok, State#{next := Id + 1}};
        Stop ->
            Stop
    end.

%% Flag port Index (1-based, in kem_sup's group) as restarting or serving.
restarting(Index, Flag) ->
    case persistent_term:get({kem, restarting}, undefined) of
        undefined -> ok;
        Flags when is_integer(Index), Index >= 1 ->
            catch atomics:put(Flags, Index, case Flag of true -> 1; false -> 0 end),
            ok;
        _ -> ok
    end.

new_state(Name, Index, Port, OsPid, Next) ->
    #{name => Name, index => Index, port => Port, next => Next, pending => #{}, probes => #{}, os_pid => OsPid,
      out => [], out_bytes => 0, timer => none,
      seen => maps:from_list([{S, true} || S <- kem_spare:shapes()]), warm_limit => kem_warm:limit()}.

handle_call({call, Method, Args, Timeout}, From, State)
        when is_atom(Method), is_tuple(Args), ?IS_TIMEOUT(Timeout) ->
    #{next := Id, pending := Pending} = State,
    Held = kem_group:held(Id, Method, Args, Timeout),
    Deadline = kem_port_deadline:of_timeout(Timeout),
    Shape = kem_warm:shape(Method, Args),
    Queued = State#{next := Id + 1, pending := Pending#{Id => {From, Deadline, Method, Shape}}},
    settle(kem_port_hold:queue(Held, kem_port_deadline:arm(Deadline, Queued)));
handle_call(os_pid, _From, State = #{os_pid := OsPid}) ->
    {reply, OsPid, State};
handle_call(_Bad, _From, State) ->
    %% Whatever else a process sends: answered, never a crash of the owner.
    {reply, {error, {bad_args, <<"not a kem_port request">>}}, State}.

handle_cast(_Msg, State) ->
    {noreply, State}.

%% Every message may end with calls still held for a calls frame: they go
%% out once the mailbox is empty (kem_port_hold:settle/1).
handle_info(Msg, State) ->
    case info(Msg, State) of
        {noreply, NewState} -> settle({ok, NewState});
        Other -> Other
    end.

%% With calls held, send them now or once the mailbox is empty. The port
%% closed under us (killed; its eof may still be in the mailbox): stop now,
%% terminate answers every caller, and the held calls, which never reached
%% the port, go to the next one.
settle(Sent) ->
    case kem_port_hold:settle(Sent) of
        {closed, State} -> stop_port_exited(closed, State);
        NoReply -> NoReply
    end.

info(timeout, State) ->
    %% The mailbox emptied with calls held (settle/1): send them now.
    case kem_port_hold:flush(State) of
        {ok, Sent} -> {noreply, Sent};
        {closed, Held} -> stop_port_exited(closed, Held)
    end;
info({Port, {data, <<?REPLIES_HEAD, ISize:32, Index:ISize/binary, ?BINARY_EXT, BSize:32, Blob:BSize/binary>>}},
     State = #{port := Port}) ->
    case split_replies(Index, Blob, 0, []) of
        {ok, Replies} ->
            {noreply, lists:foldl(fun handle_reply/2, State, Replies)};
        bad ->
            stop_port_exited(corrupt_frame, State)
    end;
info({Port, {data, Frame}}, State = #{port := Port}) ->
    case kem_port_start:decode(Frame) of
        {bad_frame, _} ->
            %% Our own port wrote something that is not a term: the stream is
            %% out of sync and no later reply can be trusted.
            stop_port_exited(corrupt_frame, State);
        {reply, Id, Result} when is_map_key(Id, map_get(probes, State)) ->
            kem_timeout:probe_answered(Id, Result, State);
        Reply ->
            {noreply, handle_reply(Reply, State)}
    end;
info({timeout, TRef, call_deadline}, State = #{timer := {_At, TRef}}) ->
    kem_port_deadline:passed(State#{timer := none});
info({probe_timeout, ProbeId}, State) ->
    kem_timeout:probe_unanswered(ProbeId, State);
info({Port, eof}, State = #{port := Port}) ->
    port_output_closed(State);
info({'EXIT', Port, Reason}, State = #{port := Port}) ->
    stop_port_exited(Reason, State);
info(_Other, State) ->
    {noreply, State}.

%% Crash reports and sys:get_status must never print a payload: a request
%% can carry hundreds of MB, and formatting it stalls the dying process while
%% it still holds the registered name.
format_status(Status) ->
    maps:map(fun(state, S) when is_map(S) ->
                     S#{pending := maps:size(maps:get(pending, S, #{})), out := length(maps:get(out, S, []))};
                (message, {call, Method, _Args, Timeout}) -> {call, Method, '...', Timeout};
                (message, {Port, {data, Frame}}) when is_binary(Frame) -> {Port, {data, byte_size(Frame)}};
                (_, Value) -> Value
             end, Status).

%% A port exit is expected (kill, crash, restart on timeout): a {shutdown, _}
%% reason keeps OTP from writing a crash report; one warning line says why.
stop_port_exited(Status, State) ->
    kem_metrics:port_exited(maps:get(name, State), Status),
    logger:warning("kem_port ~p: port exited (~0p); restarting", [maps:get(name, State), Status]),
    {stop, {shutdown, {port_exited, Status}}, State#{port := undefined}}.

%% The port's stdout closed: the process is dying (its file descriptors
%% close early in its exit, the protocol pipe being one of the first), or
%% can no longer answer anyway. Act now, not once the process is reaped,
%% which comes after the GPU driver has torn down its context: tens of ms
%% on an H100 (docs/reliability.md, "The earliest sign of death"). The
%% process is killed (the 2 s backstop of close_port/3) and reaped by
%% erl_child_setup in the background; the port is closed, so nothing of it
%% reaches the next owner, which matches only its own port anyway.
port_output_closed(State = #{port := Port, os_pid := OsPid}) ->
    close_port(Port, OsPid, later),
    stop_port_exited(output_closed, State).

terminate(Reason, State = #{pending := Pending, index := Index, out := Held}) ->
    restarting(Index, true),
    %% Held calls (for a calls or group frame) never reached the port:
    %% sent again.
    Unsent = [Id || {Id, _Item} <- Held],
    [gen_server:reply(From, ?RETRY) || {From, _, _, _} <- maps:values(maps:with(Unsent, Pending))],
    [gen_server:reply(From, pending_answer(Reason, Method))
     || {From, _, Method, _} <- maps:values(maps:without(Unsent, Pending))],
    retry_unsent(),
    close(State, Reason),
    ok.

%% After a timeout kill, the kernel calls waiting behind the stuck one are
%% sent again to the replacement (within their own deadlines): kernels are
%% pure functions of their input, and these were stuck behind another's
%% kernel. Session methods are not (the new port has no such session), and
%% after a crash nothing is: one of the calls may be what crashed the port.
pending_answer({shutdown, call_timeout}, Method) when Method =:= execute; Method =:= execute_kernel;
                                                      Method =:= execute_kernel_with_params ->
    ?RETRY;
pending_answer(Reason, _Method) ->
    {error, kem_port_call:exit_error(Reason)}.

%% Calls still in the mailbox never reached the port: their callers send
%% them again to the replacement (kem_port_call).
retry_unsent() ->
    receive
        {'$gen_call', From, {call, _Method, _Args, _Timeout}} ->
            gen_server:reply(From, ?RETRY),
            retry_unsent()
    after 0 ->
        ok
    end.

%%% internals

%% {ReqId, {ok, Result}} for each entry of a replies frame's index; bad if
%% the index and the blob disagree (then no reply of it can be trusted).
%% A result is a sub-binary of the frame (no copy); one of at most 64 bytes
%% is copied, which costs nothing and keeps the frame from being held.
split_replies(<<Id:64, Size:32, Rest/binary>>, Blob, Offset, Acc) when Offset + Size =< byte_size(Blob) ->
    Part = binary:part(Blob, Offset, Size),
    Result = case Size =< 64 of true -> binary:copy(Part); false -> Part end,
    split_replies(Rest, Blob, Offset + Size, [{reply, Id, {ok, Result}} | Acc]);
split_replies(<<>>, Blob, Offset, Acc) when Offset =:= byte_size(Blob) ->
    {ok, Acc};
split_replies(_Index, _Blob, _Offset, _Acc) ->
    bad.

handle_reply({reply, Id, Result}, State = #{pending := Pending}) ->
    case maps:take(Id, Pending) of
        {{From, _Deadline, _Method, Shape}, Rest} ->
            gen_server:reply(From, Result),
            note_shape(Result, Shape, State#{pending := Rest});
        error ->
            %% A reply after its caller timed out, or to ReqId `undefined'
            %% (a frame the port could not read): nobody is waiting for it.
            State
    end;
handle_reply(Other, State = #{name := Name}) ->
    kem_log:frame(Name, Other) orelse logger:warning("kem_port: unexpected frame ~P", [Other, 10]),
    State.

%% A kernel shape this port served well goes on the group's warm list.
note_shape({ok, _}, Shape, State = #{seen := Seen, warm_limit := Limit}) when Shape =/= none ->
    State#{seen := kem_warm:note(Shape, Seen, Limit)};
note_shape(_Result, _Shape, State) ->
    State.

%% @private Called by kem_timeout once it knows the GPU is stuck in call Id.
-spec maybe_kill(map(), integer()) -> {noreply, map()} | {stop, term(), map()}.
maybe_kill(State, Id) ->
    case application:get_env(kem, kill_on_timeout, true) of
        true ->
            logger:warning("kem_port ~p: call ~p timed out; restarting the port",
                           [maps:get(name, State), Id]),
            {stop, {shutdown, call_timeout}, State};
        false ->
            {noreply, State}
    end.

close(#{port := undefined}, _Reason) ->
    ok;
close(#{port := Port, os_pid := OsPid}, {shutdown, call_timeout}) ->
    %% The GPU thread may be inside a runaway kernel: kill now; the
    %% driver's teardown of its context then runs without us.
    close_port(Port, OsPid, now);
close(#{port := Port, os_pid := OsPid}, _Reason) ->
    close_port(Port, OsPid, later).

%% @doc Close a port and make sure its process goes (kem_port_process).
-spec close_port(port(), integer() | undefined, now | later) -> ok.
close_port(Port, OsPid, When) ->
    kem_port_process:close_port(Port, OsPid, When).

%% @doc Open a Python `kem_port' process for kem_spare (kem_port_process).
-spec open_port_process(string() | undefined, [{string(), string()}]) ->
    {ok, port(), integer() | undefined} | {error, term()}.
open_port_process(ShmDir, Env) ->
    kem_port_process:open_port_process(ShmDir, Env).

%% @doc The interpreter that runs the port (see kem_python).
-spec python_executable() -> string().
python_executable() ->
    kem_port_process:python_executable().
